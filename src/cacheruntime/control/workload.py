"""Workloads: where requests come from, synthetic or replayed from a JSONL trace.

A follow-up turn's prompt contains the previous turn's output, which only exists once that
turn has run; so a workload is a source the scheduler asks for arrivals at each step and
tells about finished requests, not a fixed list. `docs/workload.md` documents the trace
format and the synthetic generator.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Protocol

import attrs


@attrs.frozen
class RequestSpec:
    """One request: its prompt, how many tokens to generate, and from which step it may run."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: int = 0


class Source(Protocol):
    """What the scheduler needs from a workload."""

    def arrivals(self, step: int) -> list[RequestSpec]:
        """Requests that arrive at or before `step` and were not handed out yet."""

    def finished(self, spec: RequestSpec, output: tuple[int, ...]) -> None:
        """A request finished with `output`; follow-ups that wait for it may now arrive."""

    def abandoned(self, spec: RequestSpec) -> int:
        """A request was given up (no output): its follow-ups never arrive; how many they are."""

    def exhausted(self) -> bool:
        """Nothing more will ever arrive."""

    def next_arrival(self) -> int | None:
        """The earliest step a pending request arrives at (None: none pending now)."""


@attrs.frozen
class FollowUp:
    """A request whose prompt is its parent's prompt and output, then `append`."""

    request_id: str
    parent: str
    append: tuple[int, ...]
    max_new_tokens: int
    delay: int = 0  # steps after the parent finished


class ChainedSource:
    """Independent requests plus follow-ups released when their parent finishes.

    Both the synthetic generator and the trace reader produce this shape, so the scheduler
    sees one kind of source.
    """

    def __init__(self, roots: list[RequestSpec], follow_ups: list[FollowUp]):
        self.pending = sorted(roots, key=lambda r: r.arrival)
        self.waiting_on: dict[str, list[FollowUp]] = {}
        for follow in follow_ups:
            self.waiting_on.setdefault(follow.parent, []).append(follow)
        self.step = 0
        self.total = len(roots) + len(follow_ups)

    def arrivals(self, step: int) -> list[RequestSpec]:
        self.step = step
        ready = [r for r in self.pending if r.arrival <= step]
        self.pending = [r for r in self.pending if r.arrival > step]
        return ready

    def finished(self, spec: RequestSpec, output: tuple[int, ...]) -> None:
        for follow in self.waiting_on.pop(spec.request_id, []):
            prompt = spec.prompt + tuple(output) + follow.append
            self.pending.append(RequestSpec(follow.request_id, prompt, follow.max_new_tokens, self.step + 1 + follow.delay))
        self.pending.sort(key=lambda r: r.arrival)

    def abandoned(self, spec: RequestSpec) -> int:
        dropped, parents = 0, [spec.request_id]
        while parents:  # a follow-up's own follow-ups wait on it: they go too
            followers = self.waiting_on.pop(parents.pop(), [])
            dropped += len(followers)
            parents.extend(follow.request_id for follow in followers)
        return dropped

    def exhausted(self) -> bool:
        return not self.pending and not self.waiting_on

    def next_arrival(self) -> int | None:
        return self.pending[0].arrival if self.pending else None


@attrs.frozen
class SyntheticConfig:
    """Seeded multi-turn conversations that share a few system prompts."""

    requests: int = 24
    turns: int = 3
    system_prompts: int = 2
    system_tokens: int = 24
    user_tokens: tuple[int, int] = (6, 14)
    new_tokens: tuple[int, int] = (4, 10)
    arrival_gap: int = 1  # steps between the starts of consecutive conversations
    vocab: int = 97
    seed: int = 0


def synthetic(config: SyntheticConfig) -> ChainedSource:
    """Conversations of `turns` turns (the last one shorter if `requests` is not a multiple)."""
    rng = random.Random(config.seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(config.vocab) for _ in range(n))

    systems = [tokens(config.system_tokens) for _ in range(config.system_prompts)]
    roots: list[RequestSpec] = []
    follow_ups: list[FollowUp] = []
    conversation = 0
    while len(roots) + len(follow_ups) < config.requests:
        system = systems[rng.randrange(len(systems))]
        parent = f"c{conversation}t0"
        roots.append(RequestSpec(parent, system + tokens(rng.randint(*config.user_tokens)), rng.randint(*config.new_tokens), conversation * config.arrival_gap))
        for turn in range(1, config.turns):
            if len(roots) + len(follow_ups) >= config.requests:
                break
            request_id = f"c{conversation}t{turn}"
            follow_ups.append(FollowUp(request_id, parent, tokens(rng.randint(*config.user_tokens)), rng.randint(*config.new_tokens)))
            parent = request_id
        conversation += 1
    return ChainedSource(roots, follow_ups)


def read_trace(path: str | Path) -> ChainedSource:
    """A JSONL trace: one request per line (see docs/workload.md)."""
    roots, follow_ups, seen = [], [], set()
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error})") from None
        request_id = str(record.get("id", f"line{number}"))
        if request_id in seen:
            raise ValueError(f"{where}: request id {request_id!r} appears twice")
        seen.add(request_id)
        max_new = record.get("max_new_tokens")
        if not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"{where}: max_new_tokens must be an integer >= 1")
        if "after" in record:
            if record["after"] not in seen:
                raise ValueError(f"{where}: 'after' names {record['after']!r}, which no earlier line defines")
            append = _token_list(record.get("append", []), where, "append")
            follow_ups.append(FollowUp(request_id, str(record["after"]), append, max_new, int(record.get("delay", 0))))
        else:
            prompt = _token_list(record.get("prompt"), where, "prompt")
            if not prompt:
                raise ValueError(f"{where}: prompt must not be empty")
            roots.append(RequestSpec(request_id, prompt, max_new, int(record.get("arrival", 0))))
    return ChainedSource(roots, follow_ups)


def _token_list(value: object, where: str, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and t >= 0 for t in value):
        raise ValueError(f"{where}: {field} must be a list of non-negative token ids")
    return tuple(value)
