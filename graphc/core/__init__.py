"""The core of graphc: the IR and the values every later layer shares.

    errors    the exceptions users see (every one a GraphcError) and SourceLoc
    dtypes    the dtypes the IR supports
    pytree    nested containers of arrays: flatten / unflatten, ArraySpec
    ir        TensorType, OpDef, Value, Node, Region, Graph, the verifier and the text form
    literals  how attribute values and constants print (graphc.textir parses them back)
    spec      sharding specs (S / R / P per mesh axis) and their meaning on numpy arrays
    mesh      the device mesh, links and machine profiles the cost model reads
    files     atomic writes and the cache folder
    units     byte sizes and durations, read and printed

Nothing here imports any other part of graphc (see docs/architecture.md).
"""
