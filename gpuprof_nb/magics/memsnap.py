"""IPython glue for `%%memsnap`: parse the line (options.py), have the session record the
cell (session/memsnap.py), publish the report (store under -o, show unless --quiet, write
--save), then raise the cell's out-of-memory error again. No capture, analysis or
formatting here."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from gpuprof_nb.capture.cell import CellCompiler
from gpuprof_nb.errors import GpuprofError, OptionError
from gpuprof_nb.magics.options import MEMSNAP_OPTIONS, memsnap_options, option_error, with_options


@magics_class
class MemsnapMagics(Magics):
    """The `%%memsnap` cell magic."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._cells = CellCompiler(shell)

    @with_options(MEMSNAP_OPTIONS)
    @cell_magic
    def memsnap(self, line: str, cell: str) -> Any:
        """Record memory around the cell and show what used it: the timeline by allocation
        site, what was live at the peak, leaks, segments and findings. An out-of-memory
        error is reported, then raised again. A CUDA memory history you are already
        recording (torch.cuda.memory._record_memory_history) is read from the cell on and
        left running with its own settings.

        Will it fit: `--fit VAR` records the cell at VAR // 2 and VAR (the batch-size
        variable the cell reads) and predicts the peak at other batch sizes; `--budget`
        adds the largest batch and a checkpointing plan under it; `--apply` measures the
        plan (docs/fit.md).

        Example::

            %%memsnap --repeat 3 -o mem --save build/snapshot.pickle
            loss = model(x).sum(); loss.backward(); opt.step()

            %%memsnap --fit batch_size --budget 40GiB -o mem
            loss_fn(model(make_batch(batch_size)), y).backward(); opt.step()
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
        options, publish = memsnap_options(self.memsnap.parser, line)
        if not cell.strip():
            raise UsageError(
                "%%memsnap: the cell is empty; put the code to record below the magic line"
            )
        try:
            import torch  # noqa: F401 - fail here, clearly, before anything runs

            from gpuprof_nb.session.memsnap import run_cell, save_run
        except ImportError as exc:
            raise UsageError(f"%%memsnap needs PyTorch ({exc}); pip install torch") from exc
        try:
            run = run_cell(self._cells, cell, options)
        except OptionError as exc:
            raise option_error("memsnap", exc) from None
        try:
            # Stored and shown first: if saving fails below, the report is not lost.
            if publish.output:
                self._shell().user_ns[publish.output] = run.report
            if not publish.quiet:
                from IPython.display import display

                display(run.report)
            if publish.save:
                try:
                    out = save_run(run, publish.save)
                except (OSError, GpuprofError) as e:
                    kept = (
                        f"the report is stored in `{publish.output}`: save it with "
                        f"`{publish.output}.save(path)`"
                        if publish.output
                        else "the report is shown above (run with -o NAME to keep it, then "
                        "NAME.save(path))"
                    )
                    raise UsageError(
                        f"%%memsnap --save: cannot write {publish.save!r} ({e}); {kept}"
                    ) from None
                if run.source != "cuda" and not publish.quiet:
                    print(
                        f"%%memsnap: saved the CPU fallback snapshot to {out} (rebuilt from "
                        "profiler memory events; no CUDA allocator segments)"
                    )
        finally:
            # The user's out-of-memory error is what propagates, whatever happened above.
            if run.oom is not None:
                raise run.oom
        return None

    def _shell(self) -> Any:
        """The shell this magic is registered with (Magics types it as optional)."""
        if self.shell is None:
            raise UsageError("%%memsnap runs inside an IPython shell or Jupyter kernel")
        return self.shell
