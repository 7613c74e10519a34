"""What the source transform (frontend/autograph.py) needs to know about a block of statements:
the names it assigns (which become a control-flow op's results), the names a function binds, and
the first statement that leaves the block (return, break, continue, yield), which keeps a block
Python."""

from __future__ import annotations

import ast

RUNTIME = "_gc_rt"  # the name transformed code calls its runtime helpers through
Located = ast.stmt | ast.expr  # nodes with a source position (ast.AST itself has none)
# methods that change their object: ``xs.append(t)`` in a branch assigns ``xs``
MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "update",
    "setdefault",
    "popitem",
    "sort",
    "reverse",
    "add",
    "discard",
}


class Assigned(ast.NodeVisitor):
    """Names a block assigns (in its own scope), in first-assignment order; bases of subscript
    targets and of mutating calls count as assigned (``d["k"] = v``, ``outs.append(y)`` change ``d``
    and ``outs``) unless ``subscript_bases`` is False (then: the names Python binds, its locals).
    ``attribute_targets`` are the assignments to attributes, also through a subscript
    (``self.cache[i] = v``, which the transform turns into a ``_gc_rt.assign`` call)."""

    def __init__(self, subscript_bases: bool = True):
        self.names: list[str] = []
        self.attribute_targets: list[ast.AST] = []
        self.subscript_bases = subscript_bases

    def add(self, name: str) -> None:
        if name not in self.names and not name.startswith("_gc_"):
            self.names.append(name)

    def target(self, t: ast.AST) -> None:
        if isinstance(t, ast.Name):
            self.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self.target(e)
        elif isinstance(t, ast.Starred):
            self.target(t.value)
        elif isinstance(t, ast.Subscript):
            base = t.value
            while isinstance(base, ast.Subscript):
                base = base.value
            if not isinstance(base, ast.Name):
                self.attribute_targets.append(t)
            elif self.subscript_bases:
                self.add(base.id)
        elif isinstance(t, ast.Attribute):
            self.attribute_targets.append(t)

    def visit_Assign(self, node):
        for t in node.targets:
            self.target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self.target(node.target)
        self.generic_visit(node)

    def visit_NamedExpr(self, node):
        self.target(node.target)
        self.generic_visit(node)

    def visit_For(self, node):
        self.target(node.target)
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:
            if item.optional_vars is not None:
                self.target(item.optional_vars)
        self.generic_visit(node)

    def visit_Import(self, node):
        for alias in node.names:
            self.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Call(self, node):
        func = node.func
        if is_runtime_call(func, "assign") and isinstance(node.args[-1], ast.Constant) and node.args[-1].value is False:
            self.attribute_targets.append(node)  # obj.attr[key] = v, transformed (_Transformer._assign)
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and self.subscript_bases:
            base = func.value
            while isinstance(base, ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name):
                self.add(base.id)  # outs.append(y) changes outs
        self.generic_visit(node)

    def visit_ExceptHandler(self, node):
        if node.name:
            self.add(node.name)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            self.target(t)

    def visit_FunctionDef(self, node):
        self.add(node.name)  # the body is another scope

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.add(node.name)

    def visit_Lambda(self, node):
        pass

    def visit_ListComp(self, node):
        pass

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp


def is_runtime_call(func: ast.expr, name: str) -> bool:
    """Whether ``func`` is the runtime helper ``_gc_rt.<name>`` (a call the transform wrote)."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr == name
        and isinstance(func.value, ast.Name)
        and func.value.id == RUNTIME
    )


def local_names(fdef: ast.FunctionDef) -> set[str]:
    """The names local to a function: its parameters and the names its body binds."""
    args = fdef.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    bound = Assigned(subscript_bases=False)
    for stmt in fdef.body:
        bound.visit(stmt)
    return set(params) | set(bound.names)


def assigned_names(stmts: list[ast.stmt]) -> Assigned:
    """The names ``stmts`` assign (``.names``, in order of first assignment)."""
    v = Assigned()
    for s in stmts:
        v.visit(s)
    return v


def first_escape(stmts: list[ast.stmt]) -> Located | None:
    """The first statement in ``stmts`` that leaves the block early: return / yield / await
    anywhere (outside nested scopes), or break / continue that is not inside a loop nested in
    the block. Such blocks cannot become the functions of graph control flow."""

    def walk(node: ast.AST, in_loop: bool) -> Located | None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return None
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)):
            return node
        if isinstance(node, (ast.Break, ast.Continue)) and not in_loop:
            return node
        nested_loop = in_loop or isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        orelse = getattr(node, "orelse", [])
        orelse = orelse if isinstance(orelse, list) else []  # (an IfExp's orelse is an expression)
        for child in ast.iter_child_nodes(node):
            found = walk(child, nested_loop if child not in orelse else in_loop)
            if found is not None:
                return found
        return None

    for s in stmts:
        found = walk(s, False)
        if found is not None:
            return found
    return None


def statement_kind(node: ast.AST) -> str:
    """How an error names an escaping statement: "return", "break", ..."""
    return {
        ast.Return: "return",
        ast.Break: "break",
        ast.Continue: "continue",
        ast.Yield: "yield",
        ast.YieldFrom: "yield",
        ast.Await: "await",
    }.get(type(node), type(node).__name__)
