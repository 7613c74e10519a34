"""The benchmarks behind ``graphc bench``: every figure is measured in one run next to a peer or a
ceiling measured in the same run (numpy, a memory copy, one device).

    model.py      FILE:FUNC: trace, IR round trip, the direct call, interpreter, compiled
    kernels.py    fused GELU / softmax / layer norm against a copy of the same bytes
    mesh.py       FILE:FUNC --mesh: 1 device against the mesh, collectives, plans predicted vs measured
    pipeline.py   measured bubble against (S-1)/(M+S-1), 1F1B's memory against GPipe's
    plans.py      plans of several models on several meshes: predicted against measured step and memory
    comm.py       the thread communicator's all-reduce bus bandwidth against memcpy
    fastmath.py   hand-written kernels over runtime/fastmath.py against numpy
    ps.py         the parameter server: sync, SSP and async with a straggler, against sync
    timing.py     the timing and comparison helpers
    bounds.py     how far a compiled run may be from the reference interpreter (same's bounds)
"""
