"""Plain-data views of a counting run: the ``cocos count`` table rows and JSON."""

from __future__ import annotations

from cocos.counting.aggregate import fmt_mean_std

# Order in which statistics are shown: the paper's first, then the companions.
STAT_ORDER = ("C_q", "C_B", "C_0", "C_qv-", "W_qv-", "W_qv+", "W_low",
              "N_eff", "N_invsimpson", "top1_share", "n_excluded")


def ordered_stats(stats: dict) -> list[str]:
    known = [s for s in STAT_ORDER if s in stats]
    return known + sorted(s for s in stats if s not in STAT_ORDER)


def loss_table(stats_by_direction: dict) -> list[tuple[str, ...]]:
    """Rows ``(statistic, i2t, t2i)`` of one loss: ``mean ± std`` over batches."""
    directions = list(stats_by_direction)
    first = stats_by_direction[directions[0]]
    rows = []
    for stat in ordered_stats(first):
        cells = []
        for d in directions:
            entry = stats_by_direction[d][stat]
            cell = fmt_mean_std(entry)
            if entry["n_skipped"]:
                cell += f" ({entry['n_skipped']} skipped)"
            cells.append(cell)
        rows.append((stat, *cells))
    return rows
