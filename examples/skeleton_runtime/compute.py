"""The stand-in for the model's forward pass (TAGGED_COMPUTE, spec §1 "Tags").

A real engine runs attention over the row's KV and samples a token; here compute
writes each new token's version tag into its device page and returns, as the token,
`tag_digest` of the tags it reads back for the whole row. The digest is taken from
memory, not from the ledger: a compute that ran before a restore's bytes landed, or
after a page was reused under it, reads other tags and returns another token, which is
how the conformance suite sees a missing wait.

`batches.execute` plans the work in the ledger; `run` does it once the call commits,
so a failed execute leaves the KV bytes untouched too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cacheruntime.protocol import Tier, tag_digest

from .memory import Memory


@dataclass
class Work:
    """One batch's compute: the tags to write, then per item the row to read back."""

    writes: list[tuple[int, int, int]] = field(default_factory=list)  # (device phys, position, tag)
    rows: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (device phys of each row page, num_tokens)


def run(memory: Memory, work: Work, page_size: int) -> list[int]:
    """Write the tags, then each item's token: the digest of its row's tags at positions 0 .. num_tokens-1."""
    for phys, position, tag in work.writes:
        memory.write(Tier.L1, phys, position, tag)
    tokens = []
    for phys_pages, num_tokens in work.rows:
        pages = [memory.read(Tier.L1, phys) for phys in phys_pages]
        tokens.append(tag_digest(tuple(pages[p // page_size][p % page_size] for p in range(num_tokens))))
    return tokens
