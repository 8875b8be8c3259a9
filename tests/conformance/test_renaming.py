"""The renaming: a bijection learned as values are issued, never an equality, and never a crash."""

from cacheruntime.conformance.renaming import PHANTOM, Bijection, Kind, Renaming, Unmatched
from cacheruntime.protocol import (
    BatchCompletion,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    ItemResult,
    PageRun,
    PreparedBatchHandle,
    Release,
    RequestRuntimeHandle,
    TransferKind,
    TransferTicket,
)


def ref(generation, *runs, epoch=0):
    return CacheExtentRef("rt", epoch, generation, tuple(PageRun(first, count) for first, count in runs))


def test_a_bijection_binds_once_and_keeps_distinct_values_distinct():
    pages = Bijection("page name")
    assert pages.bind(100, 0) is None and pages.bind(100, 0) is None
    assert "stood for model page name 0" in pages.bind(100, 1)
    assert "both stand for model page name 0" in pages.bind(103, 0)
    assert pages.forward == {100: 0} and pages.backward == {0: 100}
    assert pages.image(100) == 0 and pages.image(7) == Unmatched("page name", 7)
    assert pages.image(7) != 7


def test_returned_values_match_up_to_renaming_and_bind_their_numbers():
    renaming = Renaming()
    # the runtime numbers pages 100, 103 (stride 3): two runs; the model's 0, 1: one run
    assert renaming.match(ref(7, (100, 1), (103, 1)), ref(1, (0, 2))) == []
    assert renaming.bijection(Kind.EXTENT, 0).forward == {7: 1}
    assert renaming.bijection(Kind.PAGE, 0).forward == {100: 0, 103: 1}
    ticket = TransferTicket("rt", 0, 9, TransferKind.BACKUP, 7, 2)
    assert renaming.match((ticket,), (TransferTicket("rt", 0, 0, TransferKind.BACKUP, 1, 2),)) == []
    assert renaming.bijection(Kind.TRANSFER, 0).forward == {9: 0}


def test_a_value_the_bijection_cannot_account_for_is_a_problem_with_its_place():
    renaming = Renaming()
    renaming.match(ref(7, (100, 2)), ref(1, (0, 2)))
    # a second extent over page 100, where the model has a fresh page 2: the runtime reused a name
    problems = renaming.match(ref(10, (100, 1)), ref(2, (2, 1)))
    assert [where for where, _ in problems] == ["value.page_runs page 0"]
    # a reused extent generation
    problems = renaming.match(ref(7, (106, 1)), ref(3, (3, 1)))
    assert [where for where, _ in problems] == ["value.generation"]
    # runs that are not the coalesced runs of their names, and a fixed field that differs
    problems = renaming.match(ref(13, (200, 1), (201, 1)), ref(4, (4, 2)))
    assert "not the coalesced runs" in problems[0][1]
    problems = renaming.match(TransferTicket("rt", 0, 9, TransferKind.BACKUP, 7, 2), TransferTicket("rt", 0, 0, TransferKind.BACKUP, 1, 3))
    assert [where for where, _ in problems] == ["value.page_count"]


def test_a_mismatch_elsewhere_does_not_stop_consistent_numbers_from_binding():
    renaming = Renaming()
    request = RequestRuntimeHandle("rt", 0, 0, 0)
    mine = BatchCompletion(PreparedBatchHandle("rt", 0, 40), (ItemResult(request, 2, 11),), (ref(7, (100, 1)),), ())
    theirs = BatchCompletion(PreparedBatchHandle("rt", 0, 0), (ItemResult(request, 2, 12),), (ref(1, (0, 1)),), ())
    problems = renaming.match(mine, theirs)
    assert [where for where, _ in problems] == ["value.items[0].next_token"]
    assert renaming.bijection(Kind.BATCH, 0).forward == {40: 0}
    assert renaming.bijection(Kind.EXTENT, 0).forward == {7: 1}


def test_arguments_reach_the_model_renamed_and_forged_values_as_phantoms():
    renaming = Renaming()
    renaming.match(ref(7, (100, 1), (103, 1)), ref(1, (0, 2)))
    renaming.match(PreparedBatchHandle("rt", 0, 40), PreparedBatchHandle("rt", 0, 0))
    request = RequestRuntimeHandle("rt", 0, 2, 5)
    plan = BatchPlan((BatchItem(request, (1, 2), (ref(7, (100, 1), (103, 1)),)),), (Release(ref(7, (100, 1), (103, 1))),))
    renamed = renaming.model_args((plan, PreparedBatchHandle("rt", 0, 40)))
    assert renamed == (
        BatchPlan((BatchItem(request, (1, 2), (ref(1, (0, 2)),)),), (Release(ref(1, (0, 2))),)),
        PreparedBatchHandle("rt", 0, 0),
    )
    # never issued by the runtime: a value the model never issued either, the same one each time
    forged = renaming.model_args(PreparedBatchHandle("rt", 0, 41))
    assert forged.batch_id >= PHANTOM and renaming.model_args(PreparedBatchHandle("rt", 0, 41)) == forged
    # the issued generation with runs that are not the issued ones: the model's runs are not its issued ones either
    assert renaming.model_args(ref(7, (100, 1), (103, 1), (10**6, 1))).page_runs[:1] == (PageRun(0, 2),)
    assert renaming.model_args(ref(7, (100, 1), (103, 1), (10**6, 1))).page_runs != (PageRun(0, 2),)
    # runs that are not coalesced were never issued: the model must not see the issued runs
    other = Renaming()
    other.match(ref(7, (100, 2)), ref(1, (0, 2)))
    assert other.model_args(ref(7, (100, 1), (101, 1))).page_runs[0] == PageRun(0, 2)
    assert other.model_args(ref(7, (100, 1), (101, 1))).page_runs[-1].first_page >= PHANTOM


def test_bijections_are_per_epoch_and_model_refs_go_back_to_the_runtime():
    renaming = Renaming()
    renaming.match(ref(7, (100, 2)), ref(1, (0, 2)))
    assert renaming.match(ref(7, (100, 2), epoch=1), ref(1, (0, 2), epoch=1)) == []  # a new epoch may reuse numbers
    assert renaming.runtime_ref(ref(1, (0, 2))) == ref(7, (100, 2))
    assert renaming.runtime_ref(ref(1, (1, 1))) == ref(7, (101, 1))
    unknown = ref(5, (9, 1))
    assert renaming.runtime_ref(unknown) == unknown  # nothing stands for it: the runtime judges the model's value
