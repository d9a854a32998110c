"""`python -m gpuprof_nb`: the `gpuprof` command line (cli.py)."""

from gpuprof_nb.cli import entry

if __name__ == "__main__":
    entry()
