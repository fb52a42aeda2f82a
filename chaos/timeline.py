"""chaos/timeline.py - one picture per run from its event log: a lane per rank at start,
time in seconds from the first launch; each event a marker, each injected fault a red
line. Drawn with matplotlib (Debian: python3-matplotlib) when it is installed; without
it draw() returns None and the report says the picture was not drawn.
"""
STYLE = {  # event -> (marker, colour, label)
    "ckpt_committed": ("o", "tab:green", "checkpoint committed"),
    "ckpt_failed": ("X", "tab:orange", "checkpoint failed"),
    "suspect": ("v", "gold", "suspect (heartbeats lost)"),
    "refuted": ("^", "gold", "refuted"),
    "peer_dead": ("x", "tab:red", "death declared"),
    "ring_rebuilt": ("s", "tab:blue", "ring rebuilt"),
    "resumed": ("*", "tab:purple", "resumed"),
    "fenced": ("D", "black", "fenced"),
}


def available():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def draw(path, events, faults, t0_ns, title):
    if not available():
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({e["_file_rank"] for e in events} | {r for f in faults for r in f.get("victims", [])}) or [0]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * len(ranks)))
    seen = set()
    for e in events:
        st = STYLE.get(e["event"])
        if not st:
            continue
        lab = st[2] if e["event"] not in seen else None
        seen.add(e["event"])
        ax.scatter([(e["t_ns"] - t0_ns) / 1e9], [e["_file_rank"]], marker=st[0], color=st[1], s=40, label=lab,
                   zorder=3)
    for f in faults:
        if not f.get("fired") or "t_ns" not in f:
            continue
        x = (f["t_ns"] - t0_ns) / 1e9
        ax.axvline(x, color="red", lw=1.2, ls="--", zorder=1)
        ax.text(x, len(ranks) - 0.4, " %s %s" % (f["kind"], f.get("victims", "")), color="red", fontsize=8,
                va="top", rotation=0)
        end = f.get("cont_ns") or f.get("end_ns")
        if end:
            ax.axvspan(x, (end - t0_ns) / 1e9, color="red", alpha=0.08)
    ax.set_yticks(ranks)
    ax.set_yticklabels(["rank %d" % r for r in ranks])
    ax.set_ylim(-0.7, len(ranks) - 0.2 if len(ranks) > 1 else 0.7)
    ax.set_xlabel("seconds since launch")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    if seen:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.2), ncol=4, fontsize=8,
                  frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
