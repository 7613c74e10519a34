"""The ``graphc`` command line (graphc/cli/main.py builds the parser).

graphc ir FILE:FUNC | FILE.gir       print (and check) the IR
graphc bench ...                     benchmarks (graphc/bench/)
graphc compile FILE:FUNC --mesh ...  plan a partition, write the plan
graphc run FILE:FUNC --mesh ...      run on a mesh of devices, check against the direct call
graphc calibrate                     measure this machine for the cost model
"""

from graphc.cli.main import main

__all__ = ["main"]
