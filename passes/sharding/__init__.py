"""Auto-sharding: choose a sharding strategy for every node of a graph on a device mesh.

    strategies.py    per-node strategies from the ops' dimension rules
    redistribute.py  spec -> spec collectives and their alpha-beta cost
    problem.py       items, edges, costs and liveness memory of one graph on one mesh
    ilp.py           shrinking (tied repeated layers, followers) and the ILP
    milp.py          the ILP's backends: HiGHS (highspy, the default), OR-Tools' CP-SAT, CBC, SCIP
    plan.py          ShardingPlan, the solver's answer as a frozen value (JSON is a view of it)
    local.py         what one device computes under a strategy (the reference the rules are tested on)

passes/partition.py runs them in order: graph -> problem -> shrink -> solve -> ShardingPlan.
"""
