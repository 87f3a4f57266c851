"""Driving chains: each chain (a generator) yields a round of variant cases and is sent their
outcomes; every chain's next round is run together, one runner session per backend
(:class:`casedb.explain.rounds.Rounds`), until every chain has returned or spent its cause's budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Task:
    """One chain of one cause: its generator, what it returned, and its round in flight."""

    key: tuple                 # (cause index, what the chain is for)
    gen: object
    result: object = None
    pending: list = field(default_factory=list)
    cut: bool = False          # stopped by the budget before it finished

    def advance(self, outs=None) -> bool:
        """Send ``outs`` (None: start); False once the chain has returned."""
        try:
            self.pending = list(self.gen.send(outs) if outs is not None else next(self.gen))
            return True
        except StopIteration as stop:
            self.result, self.pending = stop.value, []
            return False


def drive(rounds, tasks: list[Task], budget: dict) -> None:
    """Run ``tasks`` to the end; ``budget``: {cause index: variant runs left}, spent as they run
    (tasks earlier in the list are served first)."""
    active = [t for t in tasks if t.advance()]
    while active:
        batch = []
        for t in active:
            if budget[t.key[0]] >= len(t.pending):
                budget[t.key[0]] -= len(t.pending)
                batch.append(t)
            else:
                t.cut = True
                t.gen.close()
        if not batch:
            return
        by_backend: dict = {}
        for t in batch:
            for i, c in enumerate(t.pending):
                by_backend.setdefault(c.get("_backend"), []).append((t, i, c))
        outs: dict = {id(t): [None] * len(t.pending) for t in batch}
        for backend, items in by_backend.items():
            got = rounds.run([c for _, _, c in items], backend=backend)
            for (t, i, _), o in zip(items, got):
                outs[id(t)][i] = o
        active = [t for t in batch if t.advance(outs[id(t)])]
