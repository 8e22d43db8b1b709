"""The analysis of a study: its export (CSV, best JSON), the trials as a DataFrame, the
scaling-law fit, the figures, the confirmation and paired-seed statistics and the HTML report.

It reads studies through `archhpo.search` and never trains anything."""

from archhpo.report._confirm import confirmation_summary, paired_summary
from archhpo.report._export import (
    CSV_COLUMNS,
    RESULTS_CSV,
    SPEC_COLUMNS,
    best_summary,
    export_studies,
    result_rows,
)

__all__ = [
    "CSV_COLUMNS",
    "RESULTS_CSV",
    "SPEC_COLUMNS",
    "best_summary",
    "confirmation_summary",
    "export_studies",
    "paired_summary",
    "result_rows",
]
