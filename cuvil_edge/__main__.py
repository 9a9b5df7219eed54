"""python -m cuvil_edge"""

from cuvil_edge.cli.main import run

run()
