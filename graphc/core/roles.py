"""What a mesh axis is for, by its name: data (dp), model (tp), seq (sp), pipe (pp), or free.

The planner reads it (passes/sharding/roles.py) and so does a machine profile's choice of link
for an axis (graphc/core/profile.py: ``MachineProfile.link_for``).
"""

from __future__ import annotations

import difflib
import warnings

from graphc.core.errors import MeshWarning, user_stacklevel

# What an axis is for, by its name (any other name: "free"). The planner reads it
# (passes/sharding/roles.py): a data axis splits only batch dims, a seq axis only sequence dims,
# a pipe axis holds pipeline stages; model and free axes may split anything.
ROLE_NAMES = {
    "data": ("dp", "data", "batch"),
    "model": ("tp", "model", "mp"),
    "pipe": ("pp", "pipe"),
    "seq": ("sp", "seq"),
}
_ROLE_OF = {name: role for role, names in ROLE_NAMES.items() for name in names}


def axis_role(name: str) -> str:
    """The role of a mesh axis called ``name``: "data", "model", "pipe", "seq" or "free"."""
    return _ROLE_OF.get(name.lower(), "free")


def near_role_names(name: str) -> list[str]:
    """The role names (``ROLE_NAMES``) that ``name`` is close to without being one, closest
    first: what a typo (``dq`` for ``dp``) likely meant. [] for a role name or a distant name."""
    if name.lower() in _ROLE_OF:
        return []
    return difflib.get_close_matches(name.lower(), list(_ROLE_OF), n=3, cutoff=0.5)


def warn_near_role_names(names) -> None:
    """A MeshWarning for every axis name close to a role name without being one (its axis is
    free: it may split anything), naming the role it would have had. ``graphc.parallelize``
    checks the user's mesh with it (graphc's own meshes have names such as "stage" and "mb")."""
    for name in names:
        near = near_role_names(name)
        if not near:
            continue
        meant = ", ".join(f"{n} ({_ROLE_OF[n]} role)" for n in near)
        warnings.warn(
            MeshWarning(
                f"mesh axis {name!r} has no role, so it may split any dim (a free axis), but its name is close "
                f"to {meant}: if that was meant, rename the axis (roles: dp/data/batch split only batch dims, "
                "sp/seq only sequence dims, pp/pipe hold pipeline stages, tp/model/mp split anything)"
            ),
            stacklevel=user_stacklevel(),
        )
