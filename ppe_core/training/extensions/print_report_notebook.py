"""PPE's path ``training.extensions.print_report_notebook``.

``PrintReportNotebook`` is :class:`PrintReport`: its table prints the same in a notebook
(PPE's class needs IPython and ipywidgets; ours needs neither).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["PrintReport", "PrintReportNotebook"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._print_report import PrintReport
    from ppe_extensions._print_report import PrintReport as PrintReportNotebook
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(
        __name__, __all__, aliases={"PrintReportNotebook": "PrintReport"}
    )
