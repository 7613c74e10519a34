"""Source transform: Python control flow on traced values becomes graph control flow.

``transform(fn, runtime)`` parses ``fn``'s source with ``ast`` and rewrites

    if test: ... else: ...           ->  _gc_rt.if_stmt(test, true_fn, false_fn, vars, names)
    while test: ...                  ->  _gc_rt.while_stmt(cond_fn, body_fn, vars, names)
    for i in range(...): ...         ->  _gc_rt.for_range(range_args, body_fn, vars, names)
    a if test else b                 ->  _gc_rt.if_exp(test, lambda: a, lambda: b)
    a and b, a or b, not a           ->  _gc_rt.and_ / or_ / not_ (short-circuit kept for static values)
    f(args)                          ->  _gc_rt.call(f, args)   (user functions are converted too)
    a[k]                             ->  _gc_rt.getitem(a, k)   (a numpy array indexed by a traced value)
    f(..., out=buf)                  ->  buf = _gc_rt.written(buf, f(..., out=buf))
    x[k] = v, x[k] += v              ->  x = _gc_rt.assign(x, ((False, k),), v, op, True)
    obj.a[k] = v                     ->  _gc_rt.assign(obj, ((True, "a"), (False, k)), v, None, False)

where the branches and bodies become nested functions that take and return the variables the
statement assigns. Assignments into arrays are rewritten because numpy runs its own ``__setitem__``
on a numpy array: a write of traced values into one (a buffer from ``np.zeros``) must rebind the
name to the new traced array, or store it back into the attribute it came from; a local name is
rebound, so the if/loop transforms see it as assigned (a buffer filled in a traced loop is carried). At run time each helper looks at the condition: a static Python value runs
the original Python control flow, unchanged; a traced value emits ``cond`` / ``while_loop`` /
``fori_loop`` (graphc/frontend/control.py). ``runtime`` is the module of those helpers
(frontend/autograph_runtime.py, whose ``convert(fn)`` is how the rest of graphc calls this); this
module itself only rewrites syntax. The transformed code is compiled with the user's
file name and line numbers, so errors and node locations point at the original source.

Statements whose bodies ``return``, ``break``, ``continue`` or ``yield`` are left as Python, with
a check that raises TraceError (naming the line) if their condition turns out to be traced.
Functions whose source cannot be read (REPL, exec, C extensions) are traced as they are. A lambda
is converted as ``def _gc_lambda(args): return body`` (its node found in its file by the source
positions of its code), so ``graphc.grad(lambda p: loss(p, X, y))`` converts ``loss`` too.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import sys
import sysconfig
import textwrap
import types
from collections.abc import Callable
from typing import Any

from graphc.frontend.autograph_names import (
    RUNTIME,
    Located,
    assigned_names,
    first_escape,
    local_names,
    statement_kind,
)

_TYPE_PARAMS: dict[str, Any] = (
    {"type_params": []} if sys.version_info >= (3, 12) else {}
)  # a field of 3.12's FunctionDef
_FRAME_SENSITIVE = {
    "super",
    "locals",
    "globals",
    "vars",
    "eval",
    "exec",
    "range",
    "len",
    "isinstance",
    "print",
    "getattr",
    "setattr",
    "hasattr",
    "type",
    "zip",
    "enumerate",
    "iter",
    "next",
    "list",
    "dict",
    "tuple",
    "int",
    "float",
    "str",
    "bool",
    "min",
    "max",
    "abs",
    "sum",
    "sorted",
    "reversed",
    "map",
}
_SKIP_PACKAGES = ("numpy", "graphc", "scipy", "networkx", "lark", "hypothesis", "_pytest", "pytest", "numba")


class _Unreadable:
    """Why a function was not converted (kept in the cache; shown in control-flow errors)."""

    def __init__(self, reason: str):
        self.reason = reason


# Keyed by identity, never by equality: code objects compare equal across files (co_filename is
# not part of code equality), so two modules holding the same function text at the same line
# would share an entry, and a maker runs in the globals of the module it was built for. Each entry
# holds the objects its key names, so an id is not reused while its entry exists.
_cache: dict[tuple[int, int], tuple[types.CodeType, dict, Any]] = {}  # (code, globals) -> maker or _Unreadable
_generated: dict[int, types.CodeType] = {}  # code objects compiled from transformed source (already converted)
_unconverted_reasons: dict[int, tuple[types.CodeType, str]] = {}


# --- the transformer ------------------------------------------------------------------------------------


def _thunk(e: ast.expr) -> ast.Lambda:
    """``lambda: e``: an operand whose evaluation the runtime helper decides on (short-circuit)."""
    no_args = ast.arguments(
        posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]
    )
    return ast.Lambda(args=no_args, body=e)


def _rt(attr: str) -> ast.expr:
    return ast.Attribute(value=ast.Name(id=RUNTIME, ctx=ast.Load()), attr=attr, ctx=ast.Load())


def _names_tuple(names: list[str]) -> ast.expr:
    return ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())


def _current_values(names: list[str]) -> ast.expr:
    """``(x if 'x' in locals() else _gc_rt.UNDEF, ...)``: values of possibly unbound names."""
    return ast.Call(
        func=_rt("values"),
        args=[ast.Call(func=ast.Name("locals", ast.Load()), args=[], keywords=[]), _names_tuple(names)],
        keywords=[],
    )


def _def(name: str, params: list[str], body: list[ast.stmt], returns: list[str] | None) -> ast.FunctionDef:
    body = list(body)
    if returns is not None:  # values(locals(), names): a name the body deleted comes back as UNDEF
        body.append(ast.Return(value=_current_values(returns)))
    if not body:
        body = [ast.Pass()]
    return ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=p) for p in params],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
        **_TYPE_PARAMS,
    )


def _assign(names: list[str], value: ast.expr) -> ast.stmt:
    if not names:
        return ast.Expr(value=value)
    target = ast.Tuple(elts=[ast.Name(n, ast.Store()) for n in names], ctx=ast.Store())
    return ast.Assign(targets=[target], value=value)


def _locate(new: Any, original: Located) -> Any:
    """Give generated nodes the source position of the statement they replace (nodes copied from
    the user's code keep their own)."""
    for stmt in new if isinstance(new, list) else [new]:
        for n in ast.walk(stmt):
            if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                for attr, value in (
                    ("lineno", original.lineno),
                    ("col_offset", original.col_offset),
                    ("end_lineno", original.lineno),
                    ("end_col_offset", original.col_offset),
                ):
                    setattr(n, attr, value)
    return new


_AUGMENTED = {
    ast.Add: "iadd",
    ast.Sub: "isub",
    ast.Mult: "imul",
    ast.Div: "itruediv",
    ast.FloorDiv: "ifloordiv",
    ast.Mod: "imod",
    ast.Pow: "ipow",
    ast.MatMult: "imatmul",
    ast.BitAnd: "iand",
    ast.BitOr: "ior",
    ast.BitXor: "ixor",
    ast.LShift: "ilshift",
    ast.RShift: "irshift",
}


def _key(e: ast.expr) -> ast.expr:
    """A subscript's key as an expression: ``a:b`` becomes ``_gc_rt.SLICE(a, b, None)``."""
    if isinstance(e, ast.Slice):
        bounds = [b if b is not None else ast.Constant(None) for b in (e.lower, e.upper, e.step)]
        return ast.Call(func=_rt("SLICE"), args=bounds, keywords=[])
    if isinstance(e, ast.Tuple):
        return ast.Tuple(elts=[_key(x) for x in e.elts], ctx=ast.Load())
    return e


def _has_subscript(target: ast.expr) -> bool:
    if isinstance(target, ast.Subscript):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_has_subscript(e) for e in target.elts)
    return isinstance(target, ast.Starred) and _has_subscript(target.value)


class _Transformer(ast.NodeTransformer):
    def __init__(self, class_name: str | None, self_name: str | None = None, local: set[str] | None = None):
        self.counter = 0
        self.class_name = class_name
        self.self_name = self_name  # the method's first parameter, for zero-argument super()
        self.scopes = [local or set()]  # the local names of the function being transformed, innermost last
        # the names a statement at this level may rebind (aliases): the function's locals, or in a
        # traced if/loop body (a function of its own) the variables it assigns, which it takes and returns
        self.blocks: list[list[str]] = [sorted(n for n in self.scopes[0] if not n.startswith("_gc_"))]

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"_gc_{kind}_{self.counter}"

    # private names of methods are mangled as the class body would have mangled them
    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = self._mangle(node.attr)
        return node

    def _mangle(self, attr: str) -> str:
        if self.class_name and attr.startswith("__") and not attr.endswith("__"):
            return f"_{self.class_name.lstrip('_')}{attr}"
        return attr

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.scopes.append(local_names(node))
        self.blocks.append(sorted(n for n in self.scopes[-1] if not n.startswith("_gc_")))
        self.generic_visit(node)
        self.blocks.pop()
        self.scopes.pop()
        return node

    def _visit_block(self, node: ast.AST, names: list[str] | None) -> None:
        """Transform the statements inside ``node``; ``names``: the variables of the function its
        body becomes (None: it stays in the enclosing function)."""
        if names is not None:
            self.blocks.append([n for n in names if not n.startswith("_gc_")])
        self.generic_visit(node)
        if names is not None:
            self.blocks.pop()

    def _with_aliases(self, stmts: Any, node: Located) -> list[ast.stmt]:
        """``stmts`` (a statement that may write into a numpy array) followed by the rebinding of this
        level's names that hold a numpy array written with traced values (autograph_runtime.aliases)."""
        stmts = list(stmts) if isinstance(stmts, list) else [stmts]
        names = self.blocks[-1]
        if not names:
            return stmts
        temp = self.fresh("alias")
        call = ast.Call(
            func=_rt("aliases"),
            args=[ast.Call(func=ast.Name("locals", ast.Load()), args=[], keywords=[]), _names_tuple(names)],
            keywords=[],
        )
        check = ast.If(
            test=ast.Compare(left=ast.Name(temp, ast.Load()), ops=[ast.IsNot()], comparators=[ast.Constant(None)]),
            body=[_assign(names, ast.Name(temp, ast.Load()))],
            orelse=[],
        )
        return _locate(stmts + [ast.Assign(targets=[ast.Name(temp, ast.Store())], value=call), check], node)

    # subscripts: a[k] -> _gc_rt.getitem(a, k); a[k] = v -> a = _gc_rt.assign(a, ((False, k),), v)
    def visit_Subscript(self, node: ast.Subscript):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        return _locate(ast.Call(func=_rt("getitem"), args=[node.value, _key(node.slice)], keywords=[]), node)

    def _assign(self, target: ast.Subscript, value: ast.expr, op: str | None) -> ast.stmt:
        """``root.a[k1][k2] (op)= value`` as a call of ``_gc_rt.assign``, rebinding ``root`` when it
        is a local variable written through subscripts only (a numpy array may become a Tracer)."""
        steps: list[ast.expr] = []
        e: ast.expr = target
        while isinstance(e, (ast.Subscript, ast.Attribute)):
            if isinstance(e, ast.Subscript):
                step = [ast.Constant(False), _key(self.visit(e.slice))]
            else:
                step = [ast.Constant(True), ast.Constant(self._mangle(e.attr))]
            steps.append(ast.Tuple(elts=step, ctx=ast.Load()))
            e = e.value
        steps.reverse()
        only_items = all(isinstance(s.elts[0], ast.Constant) and s.elts[0].value is False for s in steps)  # type: ignore[attr-defined]
        rebind = isinstance(e, ast.Name) and e.id in self.scopes[-1] and only_items
        root = self.visit(e)
        call = ast.Call(
            func=_rt("assign"),
            args=[root, ast.Tuple(elts=steps, ctx=ast.Load()), value, ast.Constant(op), ast.Constant(rebind)],
            keywords=[],
        )
        if rebind:
            assert isinstance(e, ast.Name)  # (rebind says so)
            return ast.Assign(targets=[ast.Name(e.id, ast.Store())], value=call)
        return ast.Expr(value=call)

    def _unpack(self, target: ast.expr, value: ast.expr) -> list[ast.stmt]:
        """``target = value`` for a target that has subscripts in it (``a[i], b = ...``)."""
        if isinstance(target, ast.Subscript):
            return [self._assign(target, value, None)]
        if not _has_subscript(target):
            return [ast.Assign(targets=[self.visit(target)], value=value)]
        assert isinstance(target, (ast.Tuple, ast.List, ast.Starred))
        if isinstance(target, ast.Starred):
            return self._unpack(target.value, value)
        temps = [self.fresh("item") for _ in target.elts]
        elts: list[ast.expr] = [
            ast.Starred(ast.Name(t, ast.Store()), ast.Store())
            if isinstance(e, ast.Starred)
            else ast.Name(t, ast.Store())
            for t, e in zip(temps, target.elts)
        ]
        stmts: list[ast.stmt] = [ast.Assign(targets=[ast.Tuple(elts=elts, ctx=ast.Store())], value=value)]
        for t, e in zip(temps, target.elts):
            stmts.extend(self._unpack(e, ast.Name(t, ast.Load())))
        return stmts

    def _out_name(self, value: ast.expr) -> str | None:
        """The local name passed as ``out=`` (or ``out=(name,)``) to the call ``value``, if any."""
        if isinstance(value, ast.Call):
            for kw in value.keywords:
                out = kw.value
                if kw.arg == "out" and isinstance(out, ast.Tuple) and len(out.elts) == 1:
                    out = out.elts[0]
                if kw.arg == "out" and isinstance(out, ast.Name) and out.id in self.scopes[-1]:
                    return out.id
        return None

    def _rebind_out(self, name: str, value: ast.expr) -> ast.stmt:
        """``name = _gc_rt.written(name, value)``: a numpy ``out=`` array written with traced values."""
        call = ast.Call(func=_rt("written"), args=[ast.Name(name, ast.Load()), value], keywords=[])
        return ast.Assign(targets=[ast.Name(name, ast.Store())], value=call)

    def visit_Expr(self, node: ast.Expr):
        self.generic_visit(node)
        name = self._out_name(node.value)
        stmt = node if name is None else _locate(self._rebind_out(name, node.value), node)
        return self._with_aliases(stmt, node) if isinstance(node.value, ast.Call) else stmt

    def visit_Assign(self, node: ast.Assign):
        if not any(_has_subscript(t) for t in node.targets):
            self.generic_visit(node)
            name = self._out_name(node.value)
            if name is None:
                return node
            temp = self.fresh("out")
            first = ast.Assign(targets=[ast.Name(temp, ast.Store())], value=node.value)
            node.value = ast.Name(temp, ast.Load())
            return self._with_aliases([first, self._rebind_out(name, ast.Name(temp, ast.Load())), node], node)
        value = self.visit(node.value)
        if len(node.targets) == 1:
            return self._with_aliases(self._unpack(node.targets[0], value), node)
        temp = self.fresh("value")
        stmts: list[ast.stmt] = [ast.Assign(targets=[ast.Name(temp, ast.Store())], value=value)]
        for t in node.targets:
            stmts.extend(self._unpack(t, ast.Name(temp, ast.Load())))
        return self._with_aliases(stmts, node)

    def visit_AugAssign(self, node: ast.AugAssign):
        if not isinstance(node.target, ast.Subscript):
            self.generic_visit(node)
            return self._with_aliases(node, node)  # (buf += traced on a numpy buffer)
        value = self.visit(node.value)
        return self._with_aliases(self._assign(node.target, value, _AUGMENTED[type(node.op)]), node)

    def _static_check(self, node: ast.If | ast.While, escape: Located) -> ast.AST:
        node.test = ast.Call(
            func=_rt("static_test"),
            args=[node.test, ast.Constant(statement_kind(escape)), ast.Constant(escape.lineno)],
            keywords=[],
        )
        return _locate(node, node)

    def visit_If(self, node: ast.If):
        escape = first_escape(node.body + node.orelse)
        self._visit_block(node, None if escape is not None else assigned_names(node.body + node.orelse).names)
        if escape is not None:
            return self._with_aliases(self._static_check(node, escape), node)
        found = assigned_names(node.body + node.orelse)
        names = found.names
        true_name, false_name = self.fresh("if_true"), self.fresh("if_false")
        call = ast.Call(
            func=_rt("if_stmt"),
            args=[
                node.test,
                ast.Name(true_name, ast.Load()),
                ast.Name(false_name, ast.Load()),
                _current_values(names),
                _names_tuple(names),
                ast.Constant(bool(found.attribute_targets)),
            ],
            keywords=[],
        )
        return self._with_aliases(
            [
                _def(true_name, names, node.body, names),
                _def(false_name, names, node.orelse, names),
                _assign(names, call),
            ],
            node,
        )

    def visit_While(self, node: ast.While):
        escape = first_escape(node.body) or (first_escape(node.orelse) if node.orelse else None)
        static = escape is not None or bool(node.orelse)
        self._visit_block(node, None if static else assigned_names(node.body).names)
        if static:
            return self._with_aliases(self._static_check(node, escape or node), node)
        found = assigned_names(node.body)
        names = found.names
        cond_name, body_name = self.fresh("while_cond"), self.fresh("while_body")
        cond_fn = _def(cond_name, names, [ast.Return(value=node.test)], None)
        call = ast.Call(
            func=_rt("while_stmt"),
            args=[
                ast.Name(cond_name, ast.Load()),
                ast.Name(body_name, ast.Load()),
                _current_values(names),
                _names_tuple(names),
                ast.Constant(bool(found.attribute_targets)),
            ],
            keywords=[],
        )
        return self._with_aliases([cond_fn, _def(body_name, names, node.body, names), _assign(names, call)], node)

    def visit_For(self, node: ast.For):
        it = node.iter
        is_range = (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id == "range"
            and not it.keywords
            and 1 <= len(it.args) <= 3
            and isinstance(node.target, ast.Name)
        )
        converted = is_range and first_escape(node.body) is None and not node.orelse
        assert not converted or isinstance(node.target, ast.Name)  # (is_range says so)
        block = [node.target.id, *assigned_names(node.body).names] if converted else None  # type: ignore[attr-defined]
        self._visit_block(node, block)
        if not is_range:
            return self._with_aliases(node, node)
        assert isinstance(it, ast.Call) and isinstance(node.target, ast.Name)  # (what is_range checked)
        escape = first_escape(node.body)
        if escape is not None or node.orelse:
            node.iter = ast.Call(
                func=_rt("static_range"),
                args=[
                    ast.Tuple(elts=it.args, ctx=ast.Load()),
                    ast.Constant(statement_kind(escape) if escape else "else"),
                    ast.Constant(node.lineno),
                ],
                keywords=[],
            )
            return self._with_aliases(_locate(node, node), node)
        index = node.target.id
        found = assigned_names(node.body)
        names = [n for n in found.names if n != index]
        body_name = self.fresh("for_body")
        call = ast.Call(
            func=_rt("for_range"),
            args=[
                ast.Tuple(elts=it.args, ctx=ast.Load()),
                ast.Name(body_name, ast.Load()),
                _current_values([index] + names),
                _names_tuple([index] + names),
                ast.Constant(bool(found.attribute_targets)),
            ],
            keywords=[],
        )
        return self._with_aliases(
            [_def(body_name, [index] + names, node.body, names), _assign([index] + names, call)], node
        )

    def visit_IfExp(self, node: ast.IfExp):
        self.generic_visit(node)
        return _locate(
            ast.Call(func=_rt("if_exp"), args=[node.test, _thunk(node.body), _thunk(node.orelse)], keywords=[]), node
        )

    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        fn = "and_" if isinstance(node.op, ast.And) else "or_"
        return _locate(ast.Call(func=_rt(fn), args=[_thunk(v) for v in node.values], keywords=[]), node)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return _locate(ast.Call(func=_rt("not_"), args=[node.operand], keywords=[]), node)
        return node

    def visit_Compare(self, node: ast.Compare):
        self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        # a < b < c  ->  and_(lambda: a < b, lambda: b < c): each link may be traced
        operands = [node.left, *node.comparators]
        links = [
            ast.Compare(left=operands[i], ops=[op], comparators=[operands[i + 1]]) for i, op in enumerate(node.ops)
        ]
        return _locate(ast.Call(func=_rt("and_"), args=[_thunk(link) for link in links], keywords=[]), node)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args and self.self_name:
            # zero-argument super() needs the method's frame; branches become nested functions
            node.args = [ast.Name("__class__", ast.Load()), ast.Name(self.self_name, ast.Load())]
            return _locate(node, node)
        if isinstance(node.func, ast.Name) and (node.func.id in _FRAME_SENSITIVE or node.func.id.startswith("_gc_")):
            return node
        if (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == RUNTIME
        ):
            return node
        return _locate(ast.Call(func=_rt("call"), args=[node.func, *node.args], keywords=node.keywords), node)

    # nested functions are converted with the rest of the body (their own scope is fine); a lambda's
    # body is one expression: its calls, subscripts and if-expressions are converted like any other
    def visit_Lambda(self, node):
        args = node.args
        self.scopes.append({a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]})
        self.generic_visit(node)
        self.scopes.pop()
        return node


# --- conversion ----------------------------------------------------------------------------------------


@functools.cache
def _stdlib() -> str:
    """The standard library's folder, found once: ``sysconfig.get_paths`` expands its path
    templates on every call (12,000 calls, 1.3 s, tracing the 1,000-layer GPT)."""
    return sysconfig.get_paths().get("stdlib", "\0")


def _is_user_function(fn: types.FunctionType) -> bool:
    module = getattr(fn, "__module__", None) or ""
    if module.split(".")[0] in _SKIP_PACKAGES or module in sys.builtin_module_names:
        return False
    filename = fn.__code__.co_filename
    return not filename.startswith(_stdlib()) or "site-packages" in filename


def _class_of(fn: types.FunctionType) -> str | None:
    """The innermost class the function is lexically inside (private names are mangled with it)."""
    parts = fn.__qualname__.split(".")[:-1]
    i = len(parts) - 1
    while i >= 0:
        if parts[i] == "<locals>":
            i -= 2  # skip the enclosing function
            continue
        return parts[i]
    return None


def _build_maker(fn: types.FunctionType) -> Any:
    code = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return _Unreadable("it is a generator or coroutine")
    if fn.__name__ == "<lambda>":
        found = _lambda_def(code)
        if isinstance(found, _Unreadable):
            return found
        fdef = found
    else:
        try:  # the code object's own source: inspect would follow a decorator's __wrapped__ otherwise
            lines, first = inspect.getsourcelines(code)
        except (OSError, TypeError) as exc:
            return _Unreadable(f"its source could not be read ({exc})")
        try:
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except SyntaxError as exc:
            return _Unreadable(f"its source could not be parsed ({exc.msg})")
        fdef = tree.body[0] if tree.body else None  # type: ignore[assignment]
        if not isinstance(fdef, ast.FunctionDef) or fdef.name != code.co_name:
            return _Unreadable("its source is not a plain def")
        ast.increment_lineno(tree, first - 1)
    if any(isinstance(n, (ast.Nonlocal, ast.Global)) for n in ast.walk(fdef)):
        return _Unreadable("it declares nonlocal/global names")
    fdef.decorator_list = []
    # default values are evaluated where the function was defined (they may name that scope's
    # locals): placeholders here, the function's own __defaults__ are set on the new one
    fdef.args.defaults = [ast.Constant(None) for _ in fdef.args.defaults]
    fdef.args.kw_defaults = [None if d is None else ast.Constant(None) for d in fdef.args.kw_defaults]
    uses_super = "__class__" in code.co_freevars
    first_arg = (
        fdef.args.posonlyargs[0].arg if fdef.args.posonlyargs else (fdef.args.args[0].arg if fdef.args.args else None)
    )
    transformer = _Transformer(_class_of(fn), first_arg if uses_super else None, local_names(fdef))
    fdef.body = [transformer.visit(s) for s in fdef.body]
    fdef.body = [s for item in fdef.body for s in (item if isinstance(item, list) else [item])]
    _flatten_bodies(fdef)
    freevars = list(code.co_freevars)
    maker = ast.FunctionDef(
        name="_gc_maker",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=RUNTIME)] + [ast.arg(arg=v) for v in freevars],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=[fdef, ast.Return(value=ast.Name(fdef.name, ast.Load()))],
        decorator_list=[],
        returns=None,
        **_TYPE_PARAMS,
    )
    module = ast.Module(body=[maker], type_ignores=[])
    ast.copy_location(maker, fdef)
    ast.fix_missing_locations(module)
    namespace: dict[str, Any] = {}
    compiled = compile(module, code.co_filename, "exec")
    _generated.update((id(c), c) for c in _all_code(compiled))
    exec(compiled, fn.__globals__, namespace)  # noqa: S102
    return namespace["_gc_maker"]


def _lambda_def(code: types.CodeType) -> ast.FunctionDef | _Unreadable:
    """A lambda's source as ``def _gc_lambda(args): return body``, with the file's line numbers. The
    lambda is the node of its file, on its first line, whose span holds every source position its
    instructions record (the innermost such node: a lambda written inside another one)."""
    lines = linecache.getlines(code.co_filename)
    try:
        tree = ast.parse("".join(lines)) if lines else None
    except SyntaxError as exc:
        return _Unreadable(f"it is a lambda whose file could not be parsed ({exc.msg})")
    if tree is None:
        return _Unreadable("it is a lambda whose source could not be read")
    co_positions = getattr(code, "co_positions", None)  # (Python 3.11 and later)
    positions = [  # (RESUME, the first instruction, records an empty span at column 0)
        (line, col)
        for line, end_line, col, end_col in (co_positions() if co_positions is not None else ())
        if line is not None and col is not None and (line, col) != (end_line, end_col)
    ]
    params = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])

    def holds(node: ast.Lambda) -> bool:
        start, end = (node.lineno, node.col_offset), (node.end_lineno or node.lineno, node.end_col_offset or 0)
        names = [a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]]
        return names == params and all(start <= p < end for p in positions)

    found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == code.co_firstlineno and holds(n)]
    if not found:
        return _Unreadable("it is a lambda whose source could not be found")
    if not positions and len(found) > 1:
        return _Unreadable("it is a lambda on a line with other lambdas (Python 3.10 cannot tell them apart)")
    node = min(found, key=lambda n: ((n.end_lineno or 0) - n.lineno, (n.end_col_offset or 0) - n.col_offset))
    if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
        return _Unreadable("it is a lambda with a walrus (:=), which binds in the scope around it")
    body: list[ast.stmt] = [ast.copy_location(ast.Return(value=node.body), node.body)]
    fdef = ast.FunctionDef(
        name="_gc_lambda", args=node.args, body=body, decorator_list=[], returns=None, **_TYPE_PARAMS
    )
    return ast.copy_location(fdef, node)


def _all_code(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_code(const)


def _flatten_bodies(node: ast.AST) -> None:
    """The transformer returns lists of statements for one statement; splice them in place."""
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if isinstance(stmts, list):
            flat = []
            for s in stmts:
                flat.extend(s if isinstance(s, list) else [s])
            setattr(node, field, flat)
    for child in ast.iter_child_nodes(node):
        _flatten_bodies(child)
    for handler in getattr(node, "handlers", []):
        _flatten_bodies(handler)


def transform(fn: Callable, runtime: types.ModuleType) -> Callable:
    """``fn`` with its control flow made traceable (its new code calls the helpers of ``runtime``),
    or ``fn`` itself where that is not possible or not needed (numpy, graphc, the standard library,
    builtins, classes)."""
    if isinstance(fn, types.MethodType):
        converted = transform(fn.__func__, runtime)
        return fn if converted is fn.__func__ else types.MethodType(converted, fn.__self__)
    if isinstance(fn, functools.partial):
        inner = transform(fn.func, runtime)
        return fn if inner is fn.func else functools.partial(inner, *fn.args, **fn.keywords)
    if not isinstance(fn, types.FunctionType):
        call = inspect.getattr_static(type(fn), "__call__", None)
        if isinstance(call, types.FunctionType) and not isinstance(fn, type) and _is_user_function(call):
            converted = transform(call, runtime)
            return fn if converted is call else types.MethodType(converted, fn)
        return fn
    code = fn.__code__
    if getattr(fn, "_graphc_converted", False) or _generated.get(id(code)) is code or not _is_user_function(fn):
        return fn  # (functions nested in converted code were transformed with it)
    maker = _maker(fn)
    if isinstance(maker, _Unreadable):
        _unconverted_reasons[id(code)] = (code, maker.reason)
        return fn
    try:
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
    except ValueError:  # a closure variable that is not bound yet
        _unconverted_reasons[id(code)] = (code, "a variable it closes over is not bound yet")
        return fn
    new = maker(runtime, *cells)
    new.__defaults__ = fn.__defaults__
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__doc__ = fn.__doc__
    new.__name__ = fn.__name__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__dict__.update(fn.__dict__)
    new._graphc_converted = True
    new.__wrapped__ = fn
    return new


def _maker(fn: types.FunctionType) -> Any:
    """The cached maker of ``fn``'s converted function (built on first use): one per code object
    and globals, compared by identity (see ``_cache``)."""
    code, namespace = fn.__code__, fn.__globals__
    hit = _cache.get((id(code), id(namespace)))
    if hit is not None and hit[0] is code and hit[1] is namespace:
        return hit[2]
    try:
        maker = _build_maker(fn)
    except (SyntaxError, ValueError, TypeError) as exc:  # an unusual construct: trace it unconverted
        maker = _Unreadable(f"it could not be transformed ({exc})")
    _cache[(id(code), id(namespace))] = (code, namespace, maker)
    return maker


def unconverted_reason(code: types.CodeType) -> str | None:
    """Why the function with this code was traced without the source transform, if it was."""
    hit = _unconverted_reasons.get(id(code))
    return hit[1] if hit is not None and hit[0] is code else None
