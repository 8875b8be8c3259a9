--------------------------- MODULE CacheRuntime ---------------------------
(***************************************************************************)
(* The cacheruntime protocol at the boundary between control (scheduler,   *)
(* prefix tree) and the GPU cache runtime (KV pages, transfers, ordering). *)
(*                                                                         *)
(* Every boundary operation of spec/protocol.md is one action, named as    *)
(* the reference model's method (cacheruntime.model) in CamelCase, with    *)
(* the same preconditions and effects; variables and record fields are     *)
(* named as the model's records (spec/glossary.md lists every name).       *)
(* An operation that would raise a typed error is an action that is not    *)
(* enabled: the state does not change (H1 for stale handles, atomicity     *)
(* for every error).                                                       *)
(*                                                                         *)
(* Abstractions (the trace check in src/cacheruntime/tlatrace.py holds the *)
(* Python model to them):                                                  *)
(*  - page_size = 1 and every batch item computes exactly one token, fed   *)
(*    as input_ids (append_previous_output is not modelled);               *)
(*  - a plan item attaches at most one extent (Next; the actions take     *)
(*    any number); a plan's intents are tier intents (Restore starts at    *)
(*    PrepareBatch, Backup, Demote and Drop apply at ExecuteBatch after    *)
(*    compute, in order, all or none), of the kinds PlanIntentKinds names; *)
(*    Publish, Release and Close inside a plan are their standalone        *)
(*    actions applied after ExecuteBatch;                                  *)
(*  - a submit carries one tier intent (SubmitBackup, SubmitRestore,       *)
(*    SubmitDemote, SubmitDrop) or two (Submit: in order, all or none: the *)
(*    runtime's journal undoes the first when the second fails);           *)
(*  - compute is synchronous inside ExecuteBatch (it blocks), so the       *)
(*    compute stream is the sequence of ExecuteBatch steps.  Its wait on   *)
(*    KV_READY is an enabling condition: ExecuteBatch is enabled only when *)
(*    no H2D into a page it reads is in flight (the environment completes  *)
(*    them first, CompleteTransfer).  The D2H stream orders a backup after *)
(*    the compute event that wrote its pages: a page is backed up only     *)
(*    once written (O2).  A transfer waits for the transfers writing its   *)
(*    sources (the event of the D2H filling a host copy an H2D reads).     *)
(*    Independent transfers may complete in any order: that allows every   *)
(*    behaviour of FIFO streams and more, so safety carries over;          *)
(*  - ids (page names, extents, batches, transfers, generations, epochs)   *)
(*    are drawn from finite sets; an action that would exceed one is not   *)
(*    enabled ("model bound", never a protocol error).                     *)
(* Handles carry no runtime_id (ForeignRuntime is not modelled).           *)
(*                                                                         *)
(* E1..E4 are properties of the control side's prefix tree; they are       *)
(* proved with Z3 (cacheruntime z3), not here.  B1 and B2 are properties   *)
(* of the call interface: in this spec a plan of any size is one           *)
(* PrepareBatch step and one ExecuteBatch step (B1 by construction) and    *)
(* every action argument is a record of integers (B2 by construction);    *)
(* they are checked on the Python side (cacheruntime.invariants).          *)
(*                                                                         *)
(* Layout, as Lamport's TwoPhase.tla and Ongaro's raft.tla: variables in   *)
(* groups with a tuple each, records for handles and moves, TypeOK, Init,  *)
(* one action per step, Next, Spec, then the invariants.                   *)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    \* Named as the RuntimeInfo fields they bound (max_requests, l1_pages, ...).
    MaxRequests,        \* request slots (slot ids 0 .. MaxRequests-1)
    L1Pages,            \* physical device pages (L1)
    L2Pages,            \* physical host pages (L2); 0 means no host tier
    MaxRequestTokens,   \* max_request_tokens (page_size is 1: tokens = pages)
    MaxNames,           \* model bound: page names issued per epoch
    MaxExtents,         \* model bound: extent generations issued per epoch
    MaxBatches,         \* model bound: batches prepared per epoch
    MaxTransfers,       \* model bound: transfers started per epoch
    MaxGeneration,      \* model bound: a slot's generation
    MaxEpoch,           \* model bound: restarts
    MaxRefcount,        \* model bound: references to one extent
    PlanIntentKinds,    \* model bound: the intent kinds a plan in Next carries (at most one intent)
    MaxSubmitIntents,   \* model bound: intents per submit in Next (1 or 2)
    Faults              \* whether the environment's failures (FailTransfer, FailCompute, RuntimeLost) are enabled

(***************************************************************************)
(* Variables, in groups as the reference model's records (spec/glossary.md *)
(* names each): a field of a per-slot or per-page record is a function of  *)
(* the slot or page name; a pool's fields carry the tier's number (1:      *)
(* device, L1; 2: host, L2).  Each group has a tuple, so that an action    *)
(* says which groups it leaves alone.                                      *)
(***************************************************************************)

\* The runtime: its epoch and whether its machinery is gone.
VARIABLES
    epoch,          \* a restart bumps it, and every handle carries it
    lost            \* the runtime's machinery is gone: every operation but Restart raises RuntimeFault
runtimeVars == <<epoch, lost>>

\* Request slots: generation, liveness and the row of each slot s.
VARIABLES
    generation,     \* generation[s]: slot s's current generation
    live,           \* live[s]: slot s holds an open request
    pages,          \* pages[s]: the page names slot s's ReqToToken row maps, in token order
    numTokens       \* numTokens[s]: tokens computed in row s (Len(pages[s]) are reserved)
requestVars == <<generation, live, pages, numTokens>>

\* Page names: who holds each, what was last written to it, the next name.
VARIABLES
    holders,        \* holders[n]: live rows and extents that map page name n (0: no such page)
    versions,       \* versions[n]: version tag last written to page n (0: never written)
    nextPage        \* the next page name to issue in this epoch
pageVars == <<holders, versions, nextPage>>

\* Copies: each page name's copy per tier and the physical page it occupies.
VARIABLES
    state1,         \* state1[n]: page n's device copy, "absent" | "filling" | "valid" | "dropping"
    phys1,          \* phys1[n]: the physical device page of that copy (-1 if none)
    state2,         \* state2[n]: page n's host copy, "absent" | "filling" | "valid" | "dropping"
    phys2           \* phys2[n]: the physical host page of that copy (-1 if none)
copyVars == <<state1, phys1, state2, phys2>>

\* Pools: each tier's free list and the frees deferred behind transfers (O3).
VARIABLES
    free1,          \* the device free list (a queue of physical pages)
    free2,          \* the host free list
    deferred1,      \* deferred1[p]: in-flight transfers a deferred free of device page p waits for
    deferred2       \* deferred2[p]: the same for host page p
poolVars == <<free1, free2, deferred1, deferred2>>

\* Memory: the tags physical pages hold and the next tag; a restart keeps them (D1).
VARIABLES
    tags1,          \* tags1[p]: the version tag device page p holds (memory survives frees)
    tags2,          \* tags2[p]: the version tag host page p holds
    nextVersion     \* the next version tag; never resets, not even at a restart (D1)
memoryVars == <<tags1, tags2, nextVersion>>

\* Extents: each extent generation's references and page names, and (a ghost, for R5) the
\* references control holds by its own account of the calls it made.
VARIABLES
    extents,        \* extents[g]: extent g's refcount (0: not live) and page names
    nextExtent,     \* the next extent generation to issue in this epoch
    held            \* ghost: held[g], references to extent g control was given and has not released
extentVars == <<extents, nextExtent, held>>

\* Batches: every batch of the epoch, prepared, executed, cancelled or failed.
VARIABLES
    batches,        \* batches[b]: state, slots (plan order), row lengths before and after, intents left to apply
    nextBatch       \* the next batch id in this epoch
batchVars == <<batches, nextBatch>>

\* Transfers: those in flight, the next id, completions not yet reported, and (a ghost, for T1)
\* the transfers whose completion a poll reported.
VARIABLES
    transfers,      \* transfers[t]: transfer t: kind, moves [name, src, dst], waitsFor
    inflight,       \* transfers started and not completed (H2D and D2H streams)
    nextTransfer,   \* the next transfer id in this epoch
    unreported,     \* completions not yet reported by a poll, in completion order: [transferId, failure]
    reported        \* ghost: the transfers of this epoch whose completion a poll reported to control
transferVars == <<transfers, inflight, nextTransfer, unreported, reported>>

vars == <<runtimeVars, requestVars, pageVars, copyVars, poolVars, memoryVars, extentVars, batchVars, transferVars>>

-----------------------------------------------------------------------------
(* Sets, records and canonical values.                                     *)

Slots == 0 .. MaxRequests - 1
Names == 0 .. MaxNames - 1
Phys1 == 0 .. L1Pages - 1
Phys2 == 0 .. L2Pages - 1
EIds == 1 .. MaxExtents
BIds == 0 .. MaxBatches - 1
TIds == 0 .. MaxTransfers - 1
CopyState == {"absent", "filling", "valid", "dropping"}
Readable == {"valid", "dropping"}     \* copies that hold their page's bytes
Backed == {"valid", "filling"}        \* copies a Demote or Drop may leave as the page's only one
BatchState == {"prepared", "executed", "cancelled", "failed"}
Finished == {"executed", "cancelled", "failed"}
TransferFailures == {"none", "copy"}  \* a completion's failure: "none" (landed) or "copy"
IntentKinds == {"Backup", "Restore", "Demote", "Drop"}

(* Handles, named as the protocol's fields (no runtime_id: see above).     *)
RequestHandles == [epoch : 0 .. MaxEpoch, slotId : Slots, generation : 0 .. MaxGeneration]
ExtentRefs == [epoch : 0 .. MaxEpoch, generation : EIds]
BatchHandles == [epoch : 0 .. MaxEpoch, batchId : BIds]
(* A move of a transfer: page name, source and destination physical page.  *)
Moves == [name : Names, src : Nat, dst : Nat]
(* A completion to report: the transfer and whether (and why) it failed.   *)
Completions == [transferId : TIds, failure : TransferFailures]

NoExtent == [refcount |-> 0, pages |-> <<>>]
NoBatch == [state |-> "none", slots |-> <<>>, startTokens |-> <<>>, ends |-> <<>>, intents |-> <<>>]
NoTransfer == [kind |-> "none", pages |-> <<>>, waitsFor |-> {}]

Range(s) == {s[i] : i \in DOMAIN s}
Count(s, x) == Cardinality({i \in DOMAIN s : s[i] = x})
Seq0(n) == [i \in 1 .. n |-> i - 1]      \* <<0, 1, ..., n-1>>
(* The k-th page of free list q, or -1 (no page) past its end: only an     *)
(* action without its OutOfPages guard takes past the end, and TypeOK and  *)
(* R6 then name the copy that maps no page (an error of TLC's would not).  *)
Take(q, k) == IF k <= Len(q) THEN q[k] ELSE -1
RECURSIVE SortedSeq(_)
SortedSeq(S) == IF S = {} THEN <<>>
                ELSE LET m == CHOOSE v \in S : \A w \in S : v <= w
                     IN <<m>> \o SortedSeq(S \ {m})
RECURSIVE Concat(_)
Concat(ss) == IF ss = <<>> THEN <<>> ELSE Head(ss) \o Concat(Tail(ss))

-----------------------------------------------------------------------------
(* Handle checks (H1): a handle is valid only in its epoch, at its slot's  *)
(* generation, for a live extent or a batch issued in this epoch.          *)

ValidReq(h) == /\ h.epoch = epoch
               /\ h.slotId \in Slots            \* redundant: every handle the spec forms has slotId \in Slots (RequestHandles, ReqH)
               /\ h.generation = generation[h.slotId]
               /\ live[h.slotId]
ValidExt(x) == /\ x.epoch = epoch
               /\ x.generation \in EIds         \* redundant: every ref the spec forms has generation \in EIds (ExtentRefs, ExtH)
               /\ extents[x.generation].refcount > 0
ValidBatch(bh) == /\ bh.epoch = epoch
                  /\ bh.batchId \in BIds      \* redundant: every batch handle the spec forms has batchId \in BIds (BatchHandles, BatchH)
                  /\ bh.batchId < nextBatch    \* redundant: an id not issued yet is NoBatch, state "none", which every user of ValidBatch refuses

Exists(n) == holders[n] > 0
InPrepared(s) == \E b \in BIds : batches[b].state = "prepared" /\ s \in Range(batches[b].slots)
RowHeld == UNION {Range(pages[s]) : s \in {s2 \in Slots : live[s2]}}

-----------------------------------------------------------------------------
(* The tier state: copies, pools and transfers as one record T.  Frees and *)
(* tier intents are functions of it, so that the intents of one plan or    *)
(* one submit apply one after another inside one step, all or none (the   *)
(* runtime keeps a journal to undo the earlier ones when a later fails).   *)

Tiers == [state1 |-> state1, phys1 |-> phys1, state2 |-> state2, phys2 |-> phys2,
          free1 |-> free1, free2 |-> free2, deferred1 |-> deferred1, deferred2 |-> deferred2,
          transfers |-> transfers, inflight |-> inflight, nextTransfer |-> nextTransfer,
          unreported |-> unreported]
SetTiers(T) == /\ state1' = T.state1 /\ phys1' = T.phys1 /\ state2' = T.state2 /\ phys2' = T.phys2
               /\ free1' = T.free1 /\ free2' = T.free2 /\ deferred1' = T.deferred1 /\ deferred2' = T.deferred2
               /\ transfers' = T.transfers /\ inflight' = T.inflight /\ nextTransfer' = T.nextTransfer
               /\ unreported' = T.unreported

(* Transfers in flight that read or write physical page p of a tier.      *)
Touch1(T, p) == {t \in T.inflight : \E i \in DOMAIN T.transfers[t].pages :
                    \/ T.transfers[t].kind = "backup" /\ T.transfers[t].pages[i].src = p
                    \/ T.transfers[t].kind = "restore" /\ T.transfers[t].pages[i].dst = p}
Touch2(T, p) == {t \in T.inflight : \E i \in DOMAIN T.transfers[t].pages :
                    \/ T.transfers[t].kind = "backup" /\ T.transfers[t].pages[i].dst = p
                    \/ T.transfers[t].kind = "restore" /\ T.transfers[t].pages[i].src = p}

(* Freeing physical pages ps (a sequence) of a tier: each goes to the end  *)
(* of the free list, or, while a transfer touches it, is deferred until    *)
(* that transfer completes (O3).                                           *)
Free1After(T, ps) == LET ok(p) == Touch1(T, p) = {} IN T.free1 \o SelectSeq(ps, ok)
Deferred1After(T, ps) == [p \in Phys1 |-> IF p \in Range(ps) /\ Touch1(T, p) # {} THEN Touch1(T, p) ELSE T.deferred1[p]]
Free2After(T, ps) == LET ok(p) == Touch2(T, p) = {} IN T.free2 \o SelectSeq(ps, ok)
Deferred2After(T, ps) == [p \in Phys2 |-> IF p \in Range(ps) /\ Touch2(T, p) # {} THEN Touch2(T, p) ELSE T.deferred2[p]]

(* The physical pages of the copies that names ns (a sequence) have.       *)
PhysSeq1(T, ns) == LET has(n) == T.state1[n] # "absent" IN
                   LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> T.phys1[hs[i]]]
PhysSeq2(T, ns) == LET has(n) == T.state2[n] # "absent" IN
                   LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> T.phys2[hs[i]]]

(* T without the device (host) copies of names ns: their pages are freed.  *)
DropCopies1(T, ns) == LET gone == Range(ns)
                          ps == PhysSeq1(T, ns)
                      IN [T EXCEPT !.state1 = [n \in Names |-> IF n \in gone THEN "absent" ELSE T.state1[n]],
                                   !.phys1 = [n \in Names |-> IF n \in gone THEN -1 ELSE T.phys1[n]],
                                   !.free1 = Free1After(T, ps),
                                   !.deferred1 = Deferred1After(T, ps)]
DropCopies2(T, ns) == LET gone == Range(ns)
                          ps == PhysSeq2(T, ns)
                      IN [T EXCEPT !.state2 = [n \in Names |-> IF n \in gone THEN "absent" ELSE T.state2[n]],
                                   !.phys2 = [n \in Names |-> IF n \in gone THEN -1 ELSE T.phys2[n]],
                                   !.free2 = Free2After(T, ps),
                                   !.deferred2 = Deferred2After(T, ps)]

(* Every page name of sequence S loses one holder; a page whose count     *)
(* reaches 0 ends: its copies are freed (or deferred), in the order the    *)
(* pages end.                                                              *)
Ending(S) == {n \in Range(S) : holders[n] = Count(S, n)}
EndSeq(S) == LET last(i) == S[i] \in Ending(S) /\ \A j \in DOMAIN S : j > i => S[j] # S[i]
                 idx == SelectSeq([i \in 1 .. Len(S) |-> i], last)
             IN [k \in 1 .. Len(idx) |-> S[idx[k]]]
DropHolders(S) ==
    LET ending == Ending(S)
        es == EndSeq(S)
    IN /\ holders' = [n \in Names |-> holders[n] - Count(S, n)]
       /\ versions' = [n \in Names |-> IF n \in ending THEN 0 ELSE versions[n]]
       /\ SetTiers(DropCopies2(DropCopies1(Tiers, es), es))

(* A transfer starts with moves ms, after the transfers ws; one with      *)
(* nothing to move completes at once.                                      *)
StartTransfer(T, kind, ms, ws) ==
    IF ms = <<>>
      THEN [T EXCEPT !.nextTransfer = @ + 1,
                     !.unreported = Append(@, [transferId |-> T.nextTransfer, failure |-> "none"])]
      ELSE [T EXCEPT !.nextTransfer = @ + 1,
                     !.transfers[T.nextTransfer] = [kind |-> kind, pages |-> ms, waitsFor |-> ws],
                     !.inflight = @ \cup {T.nextTransfer}]

-----------------------------------------------------------------------------
(* Tier intents on extent generation g: for each, whether it applies to    *)
(* the tier state T (the typed error it raises otherwise is named beside   *)
(* the guard) and the tier state after it.                                 *)

(* Backup: host copies that are dropping are valid again (nothing moves); *)
(* pages without a host copy get one (filling) and a D2H starts, after the *)
(* transfers still filling their device sources.                           *)
BackupPages(T, g) == LET none(n) == T.state2[n] = "absent" IN SelectSeq(extents[g].pages, none)
Revive2(T, g) == [T EXCEPT !.state2 = [n \in Names |-> IF n \in Range(extents[g].pages) /\ T.state2[n] = "dropping"
                                                       THEN "valid" ELSE T.state2[n]]]
BackupOk(T, g) ==
    /\ Len(BackupPages(T, g)) <= Len(T.free2)                           \* OutOfPages(L2)
    /\ T.nextTransfer < MaxTransfers                                    \* model bound
AfterBackup(T0, g) ==
    LET T == Revive2(T0, g)
        bs == BackupPages(T, g)
        Taken == [T EXCEPT !.state2 = [n \in Names |-> IF n \in Range(bs) THEN "filling" ELSE T.state2[n]],
                           !.phys2 = [n \in Names |-> IF n \in Range(bs)
                                                     THEN Take(T.free2, CHOOSE i \in 1 .. Len(bs) : bs[i] = n)
                                                     ELSE T.phys2[n]],
                           !.free2 = SubSeq(T.free2, Len(bs) + 1, Len(T.free2))]
    IN StartTransfer(Taken, "backup",
                     [i \in 1 .. Len(bs) |-> [name |-> bs[i], src |-> T.phys1[bs[i]], dst |-> Take(T.free2, i)]],
                     UNION {IF T.state1[n] = "filling" THEN Touch1(T, T.phys1[n]) ELSE {} : n \in Range(bs)})

(* Restore: device copies that are dropping are valid again (nothing      *)
(* moves: scenario 1); pages without a device copy get one (filling) and   *)
(* an H2D starts, after any D2H still filling its host source.             *)
RestorePages(T, g) == LET none(n) == T.state1[n] = "absent" IN SelectSeq(extents[g].pages, none)
Revive1(T, g) == [T EXCEPT !.state1 = [n \in Names |-> IF n \in Range(extents[g].pages) /\ T.state1[n] = "dropping"
                                                       THEN "valid" ELSE T.state1[n]]]
RestoreOk(T, g) ==
    /\ \A n \in Range(RestorePages(T, g)) : T.state2[n] # "absent"     \* NotBackedUp; redundant: implied by F1 (a live page without a device copy has a readable host copy)
    /\ Len(RestorePages(T, g)) <= Len(T.free1)                          \* OutOfPages(L1)
    /\ T.nextTransfer < MaxTransfers                                    \* model bound
AfterRestore(T0, g) ==
    LET T == Revive1(T0, g)
        rs == RestorePages(T, g)
        Taken == [T EXCEPT !.state1 = [n \in Names |-> IF n \in Range(rs) THEN "filling" ELSE T.state1[n]],
                           !.phys1 = [n \in Names |-> IF n \in Range(rs)
                                                     THEN Take(T.free1, CHOOSE i \in 1 .. Len(rs) : rs[i] = n)
                                                     ELSE T.phys1[n]],
                           !.free1 = SubSeq(T.free1, Len(rs) + 1, Len(T.free1))]
    IN StartTransfer(Taken, "restore",
                     [i \in 1 .. Len(rs) |-> [name |-> rs[i], src |-> T.phys2[rs[i]], dst |-> Take(T.free1, i)]],
                     UNION {IF T.state2[n] = "filling" THEN Touch2(T, T.phys2[n]) ELSE {} : n \in Range(rs)})

(* Demote: the device copies go; every page needs a host copy valid or    *)
(* filling and no live row may map one.  A device copy whose host copy is  *)
(* still filling becomes dropping: it keeps its bytes and its page until   *)
(* the D2H lands (write-back loses nothing when that D2H fails).           *)
DemoteOk(T, g) ==
    /\ \A n \in Range(extents[g].pages) : T.state2[n] \in Backed        \* NotBackedUp
    /\ Range(extents[g].pages) \cap RowHeld = {}                        \* ExtentInUse
AfterDemote(T, g) ==
    LET ps == extents[g].pages
        now(n) == T.state2[n] = "valid"
        later == {n \in Range(ps) : T.state2[n] = "filling" /\ T.state1[n] # "absent"}
        D == DropCopies1(T, SelectSeq(ps, now))
    IN [D EXCEPT !.state1 = [n \in Names |-> IF n \in later THEN "dropping" ELSE D.state1[n]]]

(* Drop: the host copies go; every page needs a device copy valid or       *)
(* filling.  A host copy whose device copy is still filling becomes        *)
(* dropping until the H2D lands.                                           *)
DropOk(T, g) == \A n \in Range(extents[g].pages) : T.state1[n] \in Backed  \* WouldLoseData
AfterDrop(T, g) ==
    LET ps == extents[g].pages
        now(n) == T.state1[n] = "valid"
        later == {n \in Range(ps) : T.state1[n] = "filling" /\ T.state2[n] # "absent"}
        D == DropCopies2(T, SelectSeq(ps, now))
    IN [D EXCEPT !.state2 = [n \in Names |-> IF n \in later THEN "dropping" ELSE D.state2[n]]]

(* An intent is [kind |-> one of IntentKinds, extent |-> an extent ref].   *)
IntentOk(T, i) ==
    /\ ValidExt(i.extent) /\ L2Pages > 0                                \* NoL2 without a host tier
    /\ CASE i.kind = "Backup" -> BackupOk(T, i.extent.generation)
         [] i.kind = "Restore" -> RestoreOk(T, i.extent.generation)
         [] i.kind = "Demote" -> DemoteOk(T, i.extent.generation)
         [] i.kind = "Drop" -> DropOk(T, i.extent.generation)
AfterIntent(T, i) ==
    CASE i.kind = "Backup" -> AfterBackup(T, i.extent.generation)
      [] i.kind = "Restore" -> AfterRestore(T, i.extent.generation)
      [] i.kind = "Demote" -> AfterDemote(T, i.extent.generation)
      [] i.kind = "Drop" -> AfterDrop(T, i.extent.generation)
(* A sequence of intents applies in order, each to what the last left.    *)
RECURSIVE IntentsOk(_, _)
IntentsOk(T, is) == IF is = <<>> THEN TRUE ELSE IntentOk(T, Head(is)) /\ IntentsOk(AfterIntent(T, Head(is)), Tail(is))
RECURSIVE AfterIntents(_, _)
AfterIntents(T, is) == IF is = <<>> THEN T ELSE AfterIntents(AfterIntent(T, Head(is)), Tail(is))

-----------------------------------------------------------------------------
(* Plans.  A plan is [items |-> <<[request |-> a request handle,         *)
(* attach |-> <<extent refs>>], ...>>, intents |-> <<intents>>].           *)

ItemSlot(it) == it.request.slotId
AttachedPages(it) == Concat([j \in DOMAIN it.attach |-> extents[it.attach[j].generation].pages])
RowEnd(it) == Len(pages[ItemSlot(it)]) + Len(AttachedPages(it)) + 1
PlanSlots(P) == {ItemSlot(P.items[i]) : i \in DOMAIN P.items}
ItemOf(P, s) == CHOOSE i \in DOMAIN P.items : ItemSlot(P.items[i]) = s
NewName(i) == nextPage + i - 1                   \* the page name item i computes into
NewNames(P) == {NewName(i) : i \in DOMAIN P.items}
IsRestore(i) == i.kind = "Restore"
NotRestore(i) == i.kind # "Restore"
PlanRestores(P) == SelectSeq(P.intents, IsRestore)       \* started at PrepareBatch
ExecuteIntents(P) == SelectSeq(P.intents, NotRestore)    \* applied at ExecuteBatch
Restoring(P) == UNION {Range(RestorePages(Tiers, PlanRestores(P)[i].extent.generation)) : i \in DOMAIN PlanRestores(P)}

(* The plan's handles are valid and its items name distinct requests.      *)
PlanValid(P) ==
    /\ Len(P.items) >= 1                                                \* InvalidPlan; redundant: Plans forms plans of one item or more (SUBSET of live slots less {}), and the H1, H4 probes prepare plans of one item
    /\ \A i \in DOMAIN P.items : /\ ValidReq(P.items[i].request)
                                 /\ \A j \in DOMAIN P.items[i].attach : ValidExt(P.items[i].attach[j])
    /\ \A i \in DOMAIN P.intents : ValidExt(P.intents[i].extent) /\ L2Pages > 0   \* NoL2
    /\ \A i, j \in DOMAIN P.items : i # j => ItemSlot(P.items[i]) # ItemSlot(P.items[j])  \* InvalidPlan; redundant: Plans orders a set of slots (SortedSeq), so its items name distinct slots, and the H1, H4 probes prepare plans of one item

(* The plan fits: attached pages are resident (a device copy valid or     *)
(* filling; a dropping one is not) or restored by the plan, rows and the   *)
(* device pool have room, and the model bounds hold.                       *)
PlanFits(P) ==
    LET restoring == Restoring(P)
        restored == UNION {Range(extents[PlanRestores(P)[i].extent.generation].pages) : i \in DOMAIN PlanRestores(P)}
    IN
    /\ \A i \in DOMAIN P.items : LET it == P.items[i] IN
          /\ it.attach # <<>> => Len(pages[ItemSlot(it)]) = 0           \* InvalidPlan
          /\ \A n \in Range(AttachedPages(it)) :
                state1[n] \in Backed \/ n \in restored                   \* NotResident
          /\ RowEnd(it) <= MaxRequestTokens                              \* RowFull
    /\ Len(P.items) + Cardinality(restoring) <= Len(free1)             \* OutOfPages(L1)
    /\ nextBatch < MaxBatches /\ nextPage + Len(P.items) <= MaxNames   \* model bounds

(* T with one new page per item, valid, on the first free device pages.   *)
AfterNewPages(T, P) ==
    LET new == NewNames(P) IN
    [T EXCEPT !.state1 = [n \in Names |-> IF n \in new THEN "valid" ELSE T.state1[n]],
              !.phys1 = [n \in Names |-> IF n \in new THEN Take(T.free1, n - nextPage + 1) ELSE T.phys1[n]],
              !.free1 = SubSeq(T.free1, Len(P.items) + 1, Len(T.free1))]

(* Each item's row maps its attached pages (each gains a holder) and then *)
(* its new page.                                                           *)
MapRows(P) ==
    LET slots == PlanSlots(P)
        new == NewNames(P)
        attached == Concat([i \in DOMAIN P.items |-> AttachedPages(P.items[i])])
    IN
    /\ pages' = [s \in Slots |-> IF s \in slots
                                   THEN LET i == ItemOf(P, s) IN pages[s] \o AttachedPages(P.items[i]) \o <<NewName(i)>>
                                   ELSE pages[s]]
    /\ holders' = [n \in Names |-> IF n \in new THEN 1 ELSE holders[n] + Count(attached, n)]
    /\ nextPage' = nextPage + Len(P.items)

(* The batch is recorded as prepared, with the intents left for execute.   *)
RecordBatch(P) ==
    /\ batches' = [batches EXCEPT ![nextBatch] =
                    [state |-> "prepared",
                     slots |-> [i \in DOMAIN P.items |-> ItemSlot(P.items[i])],
                     startTokens |-> [i \in DOMAIN P.items |-> Len(pages[ItemSlot(P.items[i])])],
                     ends |-> [i \in DOMAIN P.items |-> RowEnd(P.items[i])],
                     intents |-> ExecuteIntents(P)]]
    /\ nextBatch' = nextBatch + 1

-----------------------------------------------------------------------------
TypeOK ==
    /\ epoch \in 0 .. MaxEpoch
    /\ lost \in BOOLEAN
    /\ generation \in [Slots -> 0 .. MaxGeneration]
    /\ live \in [Slots -> BOOLEAN]
    /\ \A s \in Slots : pages[s] \in Seq(Names) /\ Len(pages[s]) <= MaxRequestTokens
    /\ numTokens \in [Slots -> 0 .. MaxRequestTokens]
    /\ holders \in [Names -> Nat] /\ versions \in [Names -> Nat]
    /\ nextPage \in 0 .. MaxNames
    /\ state1 \in [Names -> CopyState] /\ state2 \in [Names -> CopyState]
    /\ phys1 \in [Names -> Phys1 \cup {-1}] /\ phys2 \in [Names -> Phys2 \cup {-1}]
    /\ free1 \in Seq(Phys1) /\ free2 \in Seq(Phys2)
    /\ deferred1 \in [Phys1 -> SUBSET TIds] /\ deferred2 \in [Phys2 -> SUBSET TIds]
    /\ tags1 \in [Phys1 -> Nat] /\ tags2 \in [Phys2 -> Nat]
    /\ nextVersion \in Nat \ {0}
    /\ \A g \in EIds : extents[g].refcount \in 0 .. MaxRefcount /\ extents[g].pages \in Seq(Names)
    /\ nextExtent \in 1 .. MaxExtents + 1
    /\ held \in [EIds -> 0 .. MaxRefcount]
    /\ \A b \in BIds : /\ batches[b].state \in {"none"} \cup BatchState
                       /\ \A i \in DOMAIN batches[b].intents : batches[b].intents[i].kind \in IntentKinds \ {"Restore"}
    /\ nextBatch \in 0 .. MaxBatches
    /\ \A t \in TIds : /\ transfers[t].kind \in {"none", "backup", "restore"}
                       /\ \A i \in DOMAIN transfers[t].pages : transfers[t].pages[i] \in Moves
    /\ inflight \subseteq TIds
    /\ nextTransfer \in 0 .. MaxTransfers
    /\ unreported \in Seq(Completions)
    /\ reported \subseteq TIds

Init ==
    /\ epoch = 0
    /\ lost = FALSE
    /\ generation = [s \in Slots |-> 0]
    /\ live = [s \in Slots |-> FALSE]
    /\ pages = [s \in Slots |-> <<>>]
    /\ numTokens = [s \in Slots |-> 0]
    /\ holders = [n \in Names |-> 0]
    /\ versions = [n \in Names |-> 0]
    /\ nextPage = 0
    /\ state1 = [n \in Names |-> "absent"]
    /\ phys1 = [n \in Names |-> -1]
    /\ state2 = [n \in Names |-> "absent"]
    /\ phys2 = [n \in Names |-> -1]
    /\ free1 = Seq0(L1Pages)
    /\ free2 = Seq0(L2Pages)
    /\ deferred1 = [p \in Phys1 |-> {}]
    /\ deferred2 = [p \in Phys2 |-> {}]
    /\ tags1 = [p \in Phys1 |-> 0]
    /\ tags2 = [p \in Phys2 |-> 0]
    /\ nextVersion = 1
    /\ extents = [g \in EIds |-> NoExtent]
    /\ nextExtent = 1
    /\ held = [g \in EIds |-> 0]
    /\ batches = [b \in BIds |-> NoBatch]
    /\ nextBatch = 0
    /\ transfers = [t \in TIds |-> NoTransfer]
    /\ inflight = {}
    /\ nextTransfer = 0
    /\ unreported = <<>>
    /\ reported = {}

-----------------------------------------------------------------------------
(* Actions: one per boundary operation (the model's method in CamelCase;  *)
(* one per tier intent for submit), plus the environment's                 *)
(* CompleteTransfer and its failures (FailTransfer, FailCompute,           *)
(* RuntimeLost).  While the runtime is lost every operation but Restart    *)
(* raises RuntimeFault: it is not enabled.                                 *)

\* OpenRequest: the lowest slot that is not live opens with an empty row (OutOfSlots otherwise).
OpenRequest ==
    /\ ~lost                                                            \* RuntimeFault
    /\ \E s \in {v \in Slots : \A w \in Slots : w < v => live[w]} :       \* every lower slot is live
          /\ ~live[s]                                                   \* OutOfSlots (when every slot is live)
          /\ live' = [live EXCEPT ![s] = TRUE]
          /\ pages' = [pages EXCEPT ![s] = <<>>]       \* redundant: a slot not live has an empty row already (Init, CloseRequest, Restart)
          /\ numTokens' = [numTokens EXCEPT ![s] = 0]  \* redundant: a slot not live counts no token already (Init, CloseRequest, Restart)
    /\ UNCHANGED <<runtimeVars, generation, pageVars, copyVars, poolVars, memoryVars, extentVars, batchVars,
                   transferVars>>

\* CloseRequest: the slot closes at a new generation (H2) and its row's pages lose a holder
\* (RequestBusy while in a prepared batch).
CloseRequest(h) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidReq(h)
    /\ ~InPrepared(h.slotId)
    /\ generation[h.slotId] < MaxGeneration                              \* model bound
    /\ LET s == h.slotId IN
       /\ live' = [live EXCEPT ![s] = FALSE]
       /\ generation' = [generation EXCEPT ![s] = @ + 1]
       /\ pages' = [pages EXCEPT ![s] = <<>>]          \* redundant: nothing reads a closed slot's row (RowHeld, HolderCount, O1 read live slots) and OpenRequest clears it
       /\ numTokens' = [numTokens EXCEPT ![s] = 0]     \* redundant: nothing reads a closed slot's count (O1, Publish need a live slot) and OpenRequest clears it
       /\ DropHolders(pages[s])
    /\ UNCHANGED <<runtimeVars, nextPage, memoryVars, extentVars, batchVars, reported>>

\* PrepareBatch: a valid plan that fits starts its restores, maps each row and records the batch;
\* nothing changes otherwise.
PrepareBatch(P) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ PlanValid(P)
    /\ PlanFits(P)
    /\ IntentsOk(Tiers, PlanRestores(P))
    /\ SetTiers(AfterNewPages(AfterIntents(Tiers, PlanRestores(P)), P))
    /\ MapRows(P)
    /\ RecordBatch(P)
    /\ UNCHANGED <<runtimeVars, generation, live, numTokens, versions, memoryVars, extentVars, reported>>

(* ExecuteBatch may run once no earlier prepared batch shares a request   *)
(* (OutOfOrder) and it is prepared (AlreadyExecuted, NotPrepared); its     *)
(* compute waits for KV_READY: no H2D into a page it reads in flight (O1). *)
ExecuteBatchOk(bh) ==
    /\ ValidBatch(bh)
    /\ batches[bh.batchId].state = "prepared"
    /\ \A c \in BIds : c < bh.batchId /\ batches[c].state = "prepared"
          => Range(batches[c].slots) \cap Range(batches[bh.batchId].slots) = {}
ReadsOf(B) == UNION {{pages[B.slots[i]][j] : j \in 1 .. B.ends[i]} : i \in DOMAIN B.slots}
KVReady(bh) ==
    \A t \in inflight : transfers[t].kind = "restore" =>
        \A i \in DOMAIN transfers[t].pages : transfers[t].pages[i].name \notin ReadsOf(batches[bh.batchId])
(* Every page it reads has a device copy once KV_READY: none is missing    *)
(* because a restore it waited for failed.                                 *)
ReadsLanded(bh) == \A n \in ReadsOf(batches[bh.batchId]) : state1[n] # "absent"
(* Every precondition of ExecuteBatch: in order, KV_READY reached, and its *)
(* intents apply to the tier state (compute leaves the tiers alone).       *)
CanExecute(bh) ==
    /\ ExecuteBatchOk(bh)
    /\ KVReady(bh)
    /\ IntentsOk(Tiers, batches[bh.batchId].intents)

(* Compute of batch B writes each item's token with the next version tag. *)
Compute(B) ==
    LET written(i) == pages[B.slots[i]][B.ends[i]]
        wrote == {written(i) : i \in DOMAIN B.slots}
        idx(n) == CHOOSE i \in DOMAIN B.slots : written(i) = n
        physIdx(p) == CHOOSE i \in DOMAIN B.slots : phys1[written(i)] = p
    IN
    /\ versions' = [n \in Names |-> IF n \in wrote THEN nextVersion + idx(n) - 1 ELSE versions[n]]
    /\ tags1' = [p \in Phys1 |-> IF \E i \in DOMAIN B.slots : phys1[written(i)] = p
                                   THEN nextVersion + physIdx(p) - 1 ELSE tags1[p]]
    /\ numTokens' = [s \in Slots |-> IF s \in Range(B.slots)
                                       THEN B.ends[CHOOSE i \in DOMAIN B.slots : B.slots[i] = s]
                                       ELSE numTokens[s]]
    /\ nextVersion' = nextVersion + Len(B.slots)

(* The batches that fail with batch b: b and every later prepared batch    *)
(* that shares a request with it or with one of them.                      *)
RECURSIVE Dependents(_, _)
Dependents(c, S) == IF c >= MaxBatches THEN {}
                    ELSE IF batches[c].state = "prepared" /\ Range(batches[c].slots) \cap S # {}
                         THEN {c} \cup Dependents(c + 1, S \cup Range(batches[c].slots))
                         ELSE Dependents(c + 1, S)
FailingWith(b) == {b} \cup Dependents(b + 1, Range(batches[b].slots))

(* Prepared batches F are undone as CancelBatch undoes one, newest first:  *)
(* each row returns to its length before the first of them that holds it,  *)
(* and the pages each added lose their holder.                             *)
Unreserve(F) ==
    LET newest == LET up == SortedSeq(F) IN [k \in 1 .. Len(up) |-> up[Len(up) + 1 - k]]
        added(b, i) == SubSeq(pages[batches[b].slots[i]], batches[b].startTokens[i] + 1, batches[b].ends[i])
        addedBy(b) == Concat([i \in DOMAIN batches[b].slots |-> added(b, i)])
        holds(b, s) == s \in Range(batches[b].slots)
        first(s) == CHOOSE b \in F : holds(b, s) /\ \A c \in F : holds(c, s) => b <= c
        start(s) == batches[first(s)].startTokens[CHOOSE i \in DOMAIN batches[first(s)].slots : batches[first(s)].slots[i] = s]
        rows == UNION {Range(batches[b].slots) : b \in F}
    IN /\ pages' = [s \in Slots |-> IF s \in rows THEN SubSeq(pages[s], 1, start(s)) ELSE pages[s]]
       /\ DropHolders(Concat([k \in DOMAIN newest |-> addedBy(newest[k])]))

(* The compute of batch bh failed: it and the batches that fail with it    *)
(* are failed, their reservations undone; nothing compute would have       *)
(* written is visible (no tag, no token counted, no intent applied).       *)
FailBatches(bh) ==
    LET F == FailingWith(bh.batchId) IN
    /\ Unreserve(F)
    /\ numTokens' = numTokens                                           \* no token of a failed batch counts
    /\ batches' = [b \in BIds |-> IF b \in F THEN [batches[b] EXCEPT !.state = "failed"] ELSE batches[b]]
    /\ UNCHANGED <<runtimeVars, generation, live, nextPage, memoryVars, extentVars, nextBatch, reported>>

\* ExecuteBatch: compute runs, then the plan's intents apply in order (all or none); the batch
\* never runs again (O4). If a restore it waited for failed, the batch fails instead (ComputeFailed).
ExecuteBatch(bh) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ CanExecute(bh)
    /\ IF ReadsLanded(bh)
         THEN /\ Compute(batches[bh.batchId])
              /\ SetTiers(AfterIntents(Tiers, batches[bh.batchId].intents))
              /\ batches' = [batches EXCEPT ![bh.batchId].state = "executed"]
              /\ UNCHANGED <<runtimeVars, generation, live, pages, holders, nextPage, tags2, extentVars, nextBatch, reported>>
         ELSE FailBatches(bh)

\* FailCompute (environment): ExecuteBatch of a batch whose compute fails (ComputeFailed): the batch
\* and its dependents fail with no visible effect.
FailCompute(bh) ==
    /\ Faults                                                           \* the environment's failures are modelled; redundant: a model switch (MCMutants.cfg sets Faults = TRUE), not a protocol guard
    /\ ~lost                                                            \* RuntimeFault
    /\ CanExecute(bh)
    /\ FailBatches(bh)

\* CancelBatch: rows return to their length before the batch and its pages lose their holder;
\* started restores go on.
CancelBatch(bh) ==
    LET B == batches[bh.batchId] IN
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidBatch(bh)
    /\ B.state = "prepared"
    /\ \A c \in BIds : c > bh.batchId /\ batches[c].state = "prepared"
          => Range(batches[c].slots) \cap Range(B.slots) = {}             \* BatchDependency
    /\ Unreserve({bh.batchId})
    /\ batches' = [batches EXCEPT ![bh.batchId].state = "cancelled"]
    /\ UNCHANGED <<runtimeVars, generation, live, numTokens, nextPage, memoryVars, extentVars, nextBatch, reported>>

\* Publish: computed pages first+1..first+count of a row become an extent with one reference; each
\* gains a holder (InvalidPageRun).
Publish(h, first, count) ==
    LET ps == SubSeq(pages[h.slotId], first + 1, first + count) IN
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidReq(h)
    /\ count >= 1                        \* redundant: Next and the H1, H4 probes call Publish with count >= 1 only
    /\ first >= 0                        \* redundant: Next and the H1, H4 probes call Publish with first >= 0 only
    /\ first + count <= numTokens[h.slotId]
    /\ first + count <= Len(pages[h.slotId])    \* redundant: a live row computed no more tokens than it maps (O4_Rows), so the guard above implies it
    /\ nextExtent <= MaxExtents                                         \* model bound
    /\ holders' = [n \in Names |-> holders[n] + Count(ps, n)]
    /\ extents' = [extents EXCEPT ![nextExtent] = [refcount |-> 1, pages |-> ps]]
    /\ nextExtent' = nextExtent + 1
    /\ held' = [held EXCEPT ![nextExtent] = 1]                           \* ghost: control holds the new reference
    /\ UNCHANGED <<runtimeVars, requestVars, versions, nextPage, copyVars, poolVars, memoryVars, batchVars,
                   transferVars>>

\* Split: an extent with one reference ends and two new ones cover its first `at` pages and the
\* rest (ExtentShared, InvalidPageRun).
Split(x, at) ==
    LET ps == extents[x.generation].pages IN
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ extents[x.generation].refcount = 1
    /\ 0 < at                        \* redundant: Next and the H1, H4 probes call Split with at >= 1 only
    /\ at < Len(ps)
    /\ nextExtent + 1 <= MaxExtents                                     \* model bound
    /\ extents' = [extents EXCEPT ![x.generation] = NoExtent,
                          ![nextExtent] = [refcount |-> 1, pages |-> SubSeq(ps, 1, at)],
                          ![nextExtent + 1] = [refcount |-> 1, pages |-> SubSeq(ps, at + 1, Len(ps))]]
    /\ nextExtent' = nextExtent + 2
    /\ held' = [held EXCEPT ![x.generation] = @ - 1, ![nextExtent] = 1, ![nextExtent + 1] = 1]   \* ghost: control gives up the reference it passed
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, memoryVars, batchVars, transferVars>>

(* Retain: a live extent gains a reference. *)
Retain(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ extents[x.generation].refcount < MaxRefcount                     \* model bound
    /\ extents' = [extents EXCEPT ![x.generation].refcount = @ + 1]
    /\ held' = [held EXCEPT ![x.generation] = @ + 1]                     \* ghost
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, memoryVars, nextExtent, batchVars,
                   transferVars>>

\* Release: a live extent loses a reference; with the last one it ends and its pages lose a holder.
Release(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ IF extents[x.generation].refcount = 1
         THEN /\ extents' = [extents EXCEPT ![x.generation] = NoExtent]
              /\ DropHolders(extents[x.generation].pages)
         ELSE /\ extents' = [extents EXCEPT ![x.generation].refcount = @ - 1]
              /\ UNCHANGED <<holders, versions, copyVars, poolVars>>
    /\ held' = [held EXCEPT ![x.generation] = @ - 1]                     \* ghost
    /\ UNCHANGED <<runtimeVars, requestVars, nextPage, memoryVars, nextExtent, batchVars, transferVars>>

(* SubmitBackup: a submit of one Backup intent (NoL2, OutOfPages(L2)). *)
SubmitBackup(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ L2Pages > 0                                                      \* NoL2; redundant: every model has a host tier (L2Pages > 0), a model setting, not a protocol guard
    /\ BackupOk(Tiers, x.generation)
    /\ SetTiers(AfterBackup(Tiers, x.generation))
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, reported>>

\* SubmitRestore: a submit of one Restore intent (NoL2, NotBackedUp, OutOfPages(L1)).
SubmitRestore(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ L2Pages > 0                                                      \* NoL2; redundant: every model has a host tier (L2Pages > 0), a model setting, not a protocol guard
    /\ RestoreOk(Tiers, x.generation)
    /\ SetTiers(AfterRestore(Tiers, x.generation))
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, reported>>

\* SubmitDemote: a submit of one Demote intent (NoL2, NotBackedUp, ExtentInUse).
SubmitDemote(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ L2Pages > 0                                                      \* NoL2; redundant: every model has a host tier (L2Pages > 0), a model setting, not a protocol guard
    /\ DemoteOk(Tiers, x.generation)
    /\ SetTiers(AfterDemote(Tiers, x.generation))
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, reported>>

(* SubmitDrop: a submit of one Drop intent (NoL2, WouldLoseData). *)
SubmitDrop(x) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ ValidExt(x)
    /\ L2Pages > 0                                                      \* NoL2; redundant: every model has a host tier (L2Pages > 0), a model setting, not a protocol guard
    /\ DropOk(Tiers, x.generation)
    /\ SetTiers(AfterDrop(Tiers, x.generation))
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, reported>>

\* Submit: a submit of several intents applies them in order, each to what the last left, all or
\* none.
Submit(is) ==
    /\ ~lost                                                            \* RuntimeFault
    /\ IntentsOk(Tiers, is)
    /\ SetTiers(AfterIntents(Tiers, is))
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, reported>>

(* PollCompletions: the completions not yet reported are reported, once. *)
PollCompletions ==
    /\ ~lost                                                            \* RuntimeFault
    /\ unreported' = <<>>
    /\ reported' = reported \cup {unreported[i].transferId : i \in DOMAIN unreported}   \* ghost: control has seen them
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, memoryVars, extentVars, batchVars,
                   transfers, inflight, nextTransfer>>

\* WaitCompletions: blocks until nothing is in flight (the environment completes it), then reports
\* as PollCompletions does.
WaitCompletions ==
    /\ inflight = {}             \* redundant: without it the step is PollCompletions, which Next takes in every state (the trace check holds a runtime's wait to it)
    /\ ~lost                                                            \* RuntimeFault
    /\ unreported' = <<>>
    /\ reported' = reported \cup {unreported[i].transferId : i \in DOMAIN unreported}   \* ghost: control has seen them
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, memoryVars, extentVars, batchVars,
                   transfers, inflight, nextTransfer>>

\* Restart: once nothing is in flight, or once the runtime is lost (its transfers are abandoned: their
\* copies never land, their completions are never reported), everything but memory is forgotten;
\* live slots' generations and the epoch grow (scenario 5).
Restart ==
    /\ inflight = {} \/ lost
    /\ epoch < MaxEpoch /\ \A s \in Slots : live[s] => generation[s] < MaxGeneration  \* model bounds
    /\ epoch' = epoch + 1
    /\ lost' = FALSE
    /\ generation' = [s \in Slots |-> IF live[s] THEN generation[s] + 1 ELSE generation[s]]
    /\ live' = [s \in Slots |-> FALSE]
    /\ pages' = [s \in Slots |-> <<>>]              \* redundant: a slot not live has no observable row (protocol 2.1; View hides it) and OpenRequest opens it empty
    /\ numTokens' = [s \in Slots |-> 0]             \* redundant: a slot not live has no observable count (protocol 2.1; View hides it) and OpenRequest sets it to 0
    /\ holders' = [n \in Names |-> 0]
    /\ versions' = [n \in Names |-> 0]
    /\ nextPage' = 0                                 \* legal: page names are the runtime's to number (protocol 2.2); a runtime that goes on counting is another legal one
    /\ state1' = [n \in Names |-> "absent"]
    /\ phys1' = [n \in Names |-> -1]
    /\ state2' = [n \in Names |-> "absent"]
    /\ phys2' = [n \in Names |-> -1]
    /\ free1' = Seq0(L1Pages)
    /\ free2' = Seq0(L2Pages)
    /\ deferred1' = [p \in Phys1 |-> {}]
    /\ deferred2' = [p \in Phys2 |-> {}]
    /\ extents' = [g \in EIds |-> NoExtent]
    /\ nextExtent' = 1                               \* legal: extent generations are the runtime's to number (protocol 2.2); a runtime that goes on counting is another legal one
    /\ held' = [g \in EIds |-> 0]                                        \* ghost: every reference is stale
    /\ batches' = [b \in BIds |-> NoBatch]
    /\ nextBatch' = 0
    /\ transfers' = [t \in TIds |-> NoTransfer]
    /\ inflight' = {}
    /\ nextTransfer' = 0
    /\ unreported' = <<>>
    /\ reported' = {}                                                    \* ghost: a new epoch's transfers
    /\ UNCHANGED memoryVars

(* A transfer can land or fail once the transfers it waits for did.       *)
Completable(t) ==
    /\ ~lost                                                            \* no transfer lands or fails
    /\ t \in inflight
    /\ transfers[t].waitsFor \cap inflight = {}     \* redundant: waitsFor is always empty: by F1 and T2 a restore reads only valid host copies and a backup only readable device copies, never one still filling

(* Transfer t leaves the streams: the frees that waited only for it run    *)
(* (Released1, Released2: the action puts them on the free lists, in       *)
(* ascending page order) and its completion is due for a report.           *)
Released1(t) == SortedSeq({p \in Phys1 : deferred1[p] = {t}})
Released2(t) == SortedSeq({p \in Phys2 : deferred2[p] = {t}})
Undefer1(t) == [p \in Phys1 |-> deferred1[p] \ {t}]
Undefer2(t) == [p \in Phys2 |-> deferred2[p] \ {t}]
Leave(t, failure) ==
    /\ inflight' = inflight \ {t}
    /\ transfers' = [transfers EXCEPT ![t] = NoTransfer]
    /\ unreported' = Append(unreported, [transferId |-> t, failure |-> failure])
(* The tier state once t has left: pages freed now are deferred only       *)
(* behind the other transfers still touching them (O3).                    *)
Without(t) == [Tiers EXCEPT !.inflight = @ \ {t}, !.deferred1 = Undefer1(t), !.deferred2 = Undefer2(t)]

\* CompleteTransfer (environment): a transfer whose predecessors completed lands; copies it filled
\* become valid, and where it filled the page's copy of the moment, a dropping copy of the page in
\* the other tier is dropped (its page freed, or deferred while another transfer reads it: O3);
\* frees waiting only on it run.
CompleteTransfer(t) ==
    LET ms == transfers[t].pages
        dsts == {ms[i].dst : i \in DOMAIN ms}
        srcOf(d) == ms[CHOOSE i \in DOMAIN ms : ms[i].dst = d].src
        filled(n, p) == \E i \in DOMAIN ms : ms[i].name = n /\ ms[i].dst = p
        moved == [i \in DOMAIN ms |-> ms[i].name]
    IN
    /\ Completable(t)
    /\ IF transfers[t].kind = "backup"
         THEN LET dropping(n) == state1[n] = "dropping" /\ state2[n] = "filling" /\ filled(n, phys2[n])  \* backed up now
                  behind == Range(SelectSeq(moved, dropping))
                  ps == PhysSeq1(Tiers, SelectSeq(moved, dropping))
              IN /\ tags2' = [p \in Phys2 |-> IF p \in dsts THEN tags1[srcOf(p)] ELSE tags2[p]]
                 /\ state2' = [n \in Names |-> IF state2[n] = "filling" /\ filled(n, phys2[n]) THEN "valid" ELSE state2[n]]
                 /\ state1' = [n \in Names |-> IF n \in behind THEN "absent" ELSE state1[n]]
                 /\ phys1' = [n \in Names |-> IF n \in behind THEN -1 ELSE phys1[n]]
                 /\ free1' = Free1After(Without(t), ps) \o Released1(t)
                 /\ deferred1' = Deferred1After(Without(t), ps)
                 /\ free2' = free2 \o Released2(t)
                 /\ deferred2' = Undefer2(t)
                 /\ UNCHANGED <<tags1, phys2>>
         ELSE LET dropping(n) == state2[n] = "dropping" /\ state1[n] = "filling" /\ filled(n, phys1[n])  \* restored now
                  behind == Range(SelectSeq(moved, dropping))
                  ps == PhysSeq2(Tiers, SelectSeq(moved, dropping))
              IN /\ tags1' = [p \in Phys1 |-> IF p \in dsts THEN tags2[srcOf(p)] ELSE tags1[p]]
                 /\ state1' = [n \in Names |-> IF state1[n] = "filling" /\ filled(n, phys1[n]) THEN "valid" ELSE state1[n]]
                 /\ state2' = [n \in Names |-> IF n \in behind THEN "absent" ELSE state2[n]]
                 /\ phys2' = [n \in Names |-> IF n \in behind THEN -1 ELSE phys2[n]]
                 /\ free1' = free1 \o Released1(t)
                 /\ deferred1' = Undefer1(t)
                 /\ free2' = Free2After(Without(t), ps) \o Released2(t)
                 /\ deferred2' = Deferred2After(Without(t), ps)
                 /\ UNCHANGED <<tags2, phys1>>
    /\ Leave(t, "none")
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, nextVersion, extentVars, batchVars, nextTransfer, reported>>

\* FailTransfer (environment): a transfer that could land fails instead; the copies it was filling
\* are gone (their pages freed, or deferred while another transfer touches them: O3), a dropping
\* copy of such a page in the tier it read is valid again, frees waiting only on it run, and its
\* completion reports the failure. Memory is as it was.
FailTransfer(t) ==
    LET ms == transfers[t].pages
        filling(n, p) == \E i \in DOMAIN ms : ms[i].name = n /\ ms[i].dst = p
        moved == [i \in DOMAIN ms |-> ms[i].name]
    IN
    /\ Faults                                                           \* the environment's failures are modelled; redundant: a model switch (MCMutants.cfg sets Faults = TRUE), not a protocol guard
    /\ Completable(t)
    /\ IF transfers[t].kind = "backup"
         THEN LET into(n) == state2[n] = "filling" /\ filling(n, phys2[n])    \* host copies the D2H was filling
                  gone == Range(SelectSeq(moved, into))
                  ps == PhysSeq2(Tiers, SelectSeq(moved, into))
              IN /\ state2' = [n \in Names |-> IF n \in gone THEN "absent" ELSE state2[n]]
                 /\ phys2' = [n \in Names |-> IF n \in gone THEN -1 ELSE phys2[n]]
                 /\ free2' = Free2After(Without(t), ps) \o Released2(t)
                 /\ deferred2' = Deferred2After(Without(t), ps)
                 /\ state1' = [n \in Names |-> IF n \in gone /\ state1[n] = "dropping" THEN "valid" ELSE state1[n]]
                 /\ free1' = free1 \o Released1(t)
                 /\ deferred1' = Undefer1(t)
                 /\ UNCHANGED phys1
         ELSE LET into(n) == state1[n] = "filling" /\ filling(n, phys1[n])    \* device copies the H2D was filling
                  gone == Range(SelectSeq(moved, into))
                  ps == PhysSeq1(Tiers, SelectSeq(moved, into))
              IN /\ state1' = [n \in Names |-> IF n \in gone THEN "absent" ELSE state1[n]]
                 /\ phys1' = [n \in Names |-> IF n \in gone THEN -1 ELSE phys1[n]]
                 /\ free1' = Free1After(Without(t), ps) \o Released1(t)
                 /\ deferred1' = Deferred1After(Without(t), ps)
                 /\ state2' = [n \in Names |-> IF n \in gone /\ state2[n] = "dropping" THEN "valid" ELSE state2[n]]
                 /\ free2' = free2 \o Released2(t)
                 /\ deferred2' = Undefer2(t)
                 /\ UNCHANGED phys2
    /\ Leave(t, "copy")
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, memoryVars, extentVars, batchVars, nextTransfer, reported>>

\* RuntimeLost (environment): the runtime's machinery is gone (a stream worker died); nothing
\* changes but that every operation except Restart now raises RuntimeFault.
RuntimeLost ==
    /\ Faults                                                           \* the environment's failures are modelled; redundant: a model switch (MCMutants.cfg sets Faults = TRUE), not a protocol guard
    /\ ~lost                                                            \* redundant: losing a lost runtime again changes nothing (a stuttering step)
    /\ lost' = TRUE
    /\ UNCHANGED <<epoch, requestVars, pageVars, copyVars, poolVars, memoryVars, extentVars, batchVars,
                   transferVars>>

-----------------------------------------------------------------------------
(* The next-state relation: control calls every operation with current     *)
(* handles (a stale handle enables nothing: H1 below checks it), the       *)
(* environment completes transfers and, when Faults (its failure actions   *)
(* say so first), makes transfers and compute fail and the runtime's       *)
(* machinery go.                                                           *)

ReqH(s) == [epoch |-> epoch, slotId |-> s, generation |-> generation[s]]
ExtH(g) == [epoch |-> epoch, generation |-> g]
BatchH(b) == [epoch |-> epoch, batchId |-> b]
LiveExts == {g \in EIds : extents[g].refcount > 0}
TierIntents == [kind : IntentKinds, extent : {ExtH(g) : g \in LiveExts}]
AttachChoices == {<<>>} \cup {<<ExtH(g)>> : g \in LiveExts}
PlanIntentChoices == {<<>>} \cup {<<i>> : i \in {j \in TierIntents : j.kind \in PlanIntentKinds}}
Plans ==
    UNION {{[items |-> [i \in 1 .. Len(ss) |-> [request |-> ReqH(ss[i]), attach |-> a[i]]], intents |-> is] :
               a \in [1 .. Len(ss) -> AttachChoices], is \in PlanIntentChoices} :
           ss \in {SortedSeq(S) : S \in (SUBSET {s \in Slots : live[s]}) \ {{}}}}

Next ==
    \/ OpenRequest
    \/ \E s \in Slots : CloseRequest(ReqH(s))
    \/ \E P \in Plans : PrepareBatch(P)
    \/ \E b \in BIds : ExecuteBatch(BatchH(b))
    \/ \E b \in BIds : CancelBatch(BatchH(b))
    \/ \E s \in Slots, f \in 0 .. MaxRequestTokens - 1, c \in 1 .. MaxRequestTokens : Publish(ReqH(s), f, c)
    \/ \E g \in LiveExts : Retain(ExtH(g))
    \/ \E g \in LiveExts : Release(ExtH(g))
    \/ \E g \in LiveExts : \E at \in 1 .. Len(extents[g].pages) : Split(ExtH(g), at)
    \/ \E g \in LiveExts : SubmitBackup(ExtH(g))
    \/ \E g \in LiveExts : SubmitRestore(ExtH(g))
    \/ \E g \in LiveExts : SubmitDemote(ExtH(g))
    \/ \E g \in LiveExts : SubmitDrop(ExtH(g))
    \/ MaxSubmitIntents >= 2 /\ \E i, j \in TierIntents : Submit(<<i, j>>)
    \/ PollCompletions
    \/ WaitCompletions
    \/ Restart
    \/ \E t \in TIds : CompleteTransfer(t)
    \/ \E t \in TIds : FailTransfer(t)
    \/ \E b \in BIds : FailCompute(BatchH(b))
    \/ RuntimeLost

Spec == Init /\ [][Next]_vars

(* For model checking only (the VIEW of the MC configs): the bytes of a    *)
(* physical page that no readable copy maps and no in-flight transfer reads *)
(* are never read again before being overwritten, and the row and count of *)
(* a slot that is not live are never read before OpenRequest clears them   *)
(* (protocol.md 2.1: not observable), so states that differ only there     *)
(* behave alike.                                                           *)
Read1 == {phys1[n] : n \in {m \in Names : state1[m] \in Readable}}
         \cup UNION {{transfers[t].pages[i].src : i \in DOMAIN transfers[t].pages} :
                     t \in {u \in inflight : transfers[u].kind = "backup"}}
Read2 == {phys2[n] : n \in {m \in Names : state2[m] \in Readable}}
         \cup UNION {{transfers[t].pages[i].src : i \in DOMAIN transfers[t].pages} :
                     t \in {u \in inflight : transfers[u].kind = "restore"}}
View == <<runtimeVars, generation, live,
          [s \in Slots |-> IF live[s] THEN pages[s] ELSE <<>>],
          [s \in Slots |-> IF live[s] THEN numTokens[s] ELSE 0], pageVars, copyVars, poolVars,
          [p \in Phys1 |-> IF p \in Read1 THEN tags1[p] ELSE 0],
          [p \in Phys2 |-> IF p \in Read2 THEN tags2[p] ELSE 0], nextVersion,
          extentVars, batchVars, transferVars>>

(* Liveness: the environment completes every transfer it can and control   *)
(* executes every batch it can.                                            *)
Fairness ==
    /\ \A t \in TIds : WF_vars(CompleteTransfer(t))
    /\ \A b \in BIds : WF_vars(ExecuteBatch(BatchH(b)))
LiveSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Invariants, named by catalogue id (spec/invariants.md).                 *)

StaleReq(h) == h.epoch < epoch \/ (h.epoch = epoch /\ h.generation < generation[h.slotId])
StaleExt(x) == x.epoch < epoch \/ (x.epoch = epoch /\ x.generation < nextExtent /\ extents[x.generation].refcount = 0)
StaleBatch(bh) == bh.epoch < epoch

(* Every operation that names the handle is refused (not enabled).  An    *)
(* extent ref is refused inside a plan too: attached to a row, or the      *)
(* extent of a plan's intent (started at prepare, or applied at execute),  *)
(* and inside a submit of one intent of each kind.                         *)
RequestRefused(h) ==
    /\ ~ENABLED CloseRequest(h)
    /\ ~ENABLED Publish(h, 0, 1)
    /\ ~ENABLED PrepareBatch([items |-> <<[request |-> h, attach |-> <<>>]>>, intents |-> <<>>])
ExtentRefused(x) ==
    /\ ~ENABLED Retain(x)
    /\ ~ENABLED Release(x)
    /\ ~ENABLED Split(x, 1)
    /\ ~ENABLED SubmitBackup(x)
    /\ ~ENABLED SubmitRestore(x)
    /\ ~ENABLED SubmitDemote(x)
    /\ ~ENABLED SubmitDrop(x)
    /\ \A k \in IntentKinds : ~ENABLED Submit(<<[kind |-> k, extent |-> x]>>)
    /\ \A s \in {v \in Slots : live[v]} :
          /\ ~ENABLED PrepareBatch([items |-> <<[request |-> ReqH(s), attach |-> <<x>>]>>, intents |-> <<>>])
          /\ \A k \in {"Restore", "Demote"} :
                ~ENABLED PrepareBatch([items |-> <<[request |-> ReqH(s), attach |-> <<>>]>>,
                                       intents |-> <<[kind |-> k, extent |-> x]>>])
BatchRefused(bh) == ~ENABLED ExecuteBatch(bh) /\ ~ENABLED CancelBatch(bh) /\ ~ENABLED FailCompute(bh)

(* H1: no operation given a stale handle is enabled: it changes nothing.   *)
H1_StaleRequestHandle == \A h \in RequestHandles : StaleReq(h) => RequestRefused(h)
H1_StaleExtentRef == \A x \in ExtentRefs : StaleExt(x) => ExtentRefused(x)
H1_StaleBatchHandle == \A bh \in BatchHandles : StaleBatch(bh) => BatchRefused(bh)
H1 == H1_StaleRequestHandle /\ H1_StaleExtentRef /\ H1_StaleBatchHandle

(* H4: no operation given a handle that was never issued is enabled: one   *)
(* of a later epoch, of a slot at a later generation or not open at its    *)
(* current one, an extent or a batch id not issued yet in this epoch.      *)
UnissuedReq(h) == \/ h.epoch > epoch
                  \/ h.epoch = epoch /\ h.generation > generation[h.slotId]
                  \/ h.epoch = epoch /\ h.generation = generation[h.slotId] /\ ~live[h.slotId]
UnissuedExt(x) == x.epoch > epoch \/ (x.epoch = epoch /\ x.generation >= nextExtent)
UnissuedBatch(bh) == bh.epoch > epoch \/ (bh.epoch = epoch /\ bh.batchId >= nextBatch)
H4 == /\ \A h \in RequestHandles : UnissuedReq(h) => RequestRefused(h)
      /\ \A x \in ExtentRefs : UnissuedExt(x) => ExtentRefused(x)
      /\ \A bh \in BatchHandles : UnissuedBatch(bh) => BatchRefused(bh)

(* H2 (an action property): generations never decrease, a slot that stops *)
(* being live moves to a new generation, and only a slot that stops being  *)
(* live does: a live slot keeps the generation its OpenRequest handed out. *)
H2 == [][\A s \in Slots : /\ generation'[s] >= generation[s]
                          /\ (live[s] /\ ~live'[s]) => generation'[s] > generation[s]
                          /\ generation'[s] # generation[s] => live[s] /\ ~live'[s]]_vars

(* H3: at most one request handle per slot is current, and OpenRequest     *)
(* hands out a slot that was not live: while one is free (and the runtime  *)
(* not lost) it opens one (OutOfSlots only when every slot is live).       *)
H3 == /\ \A s \in Slots : Cardinality({h \in RequestHandles : h.slotId = s /\ ValidReq(h)}) <= 1
      /\ ~lost /\ (\E s \in Slots : ~live[s]) => ENABLED (OpenRequest /\ \E s \in Slots : ~live[s] /\ live'[s])

Mapped1 == {phys1[n] : n \in {m \in Names : state1[m] # "absent"}}
Mapped2 == {phys2[n] : n \in {m \in Names : state2[m] # "absent"}}
Deferred1 == {p \in Phys1 : deferred1[p] # {}}
Deferred2 == {p \in Phys2 : deferred2[p] # {}}
CopiesOf1(p) == Cardinality({n \in Names : state1[n] # "absent" /\ phys1[n] = p})
CopiesOf2(p) == Cardinality({n \in Names : state2[n] # "absent" /\ phys2[n] = p})

(* R1: every physical page is exactly one of free, mapped to one page      *)
(* name's copy, or deferred; free + held = total, in both pools.  A        *)
(* deferred free waits only on transfers in flight (so it runs).           *)
R1 == /\ \A p \in Phys1 : Count(free1, p) + CopiesOf1(p) + (IF p \in Deferred1 THEN 1 ELSE 0) = 1
      /\ \A p \in Phys2 : Count(free2, p) + CopiesOf2(p) + (IF p \in Deferred2 THEN 1 ELSE 0) = 1
      /\ \A p \in Phys1 : deferred1[p] \subseteq inflight
      /\ \A p \in Phys2 : deferred2[p] \subseteq inflight

Held(n) == (\E s \in Slots : live[s] /\ n \in Range(pages[s])) \/ (\E g \in EIds : n \in Range(extents[g].pages))

(* R2: no physical page of a page name held by a live row or extent is on  *)
(* a free list; every held page name exists.                               *)
R2 == \A n \in Names : Held(n) =>
        /\ Exists(n)
        /\ state1[n] # "absent" => phys1[n] \notin Range(free1)
        /\ state2[n] # "absent" => phys2[n] \notin Range(free2)

(* R3: a page's holder count equals its live rows and extents.             *)
HolderCount(n) == (LET ls == {s \in Slots : live[s]} IN
                     Cardinality({<<s, i>> \in ls \X (1 .. MaxRequestTokens) : i <= Len(pages[s]) /\ pages[s][i] = n}))
                  + Cardinality({<<g, i>> \in EIds \X (1 .. MaxRequestTokens) :
                                   extents[g].refcount > 0 /\ i <= Len(extents[g].pages) /\ extents[g].pages[i] = n})
R3 == \A n \in Names : holders[n] = HolderCount(n)

(* R4: no physical page is free twice, or free while mapped or deferred.   *)
R4 == /\ \A p \in Phys1 : Count(free1, p) <= 1
      /\ \A p \in Phys2 : Count(free2, p) <= 1
      /\ Range(free1) \cap (Mapped1 \cup Deferred1) = {}
      /\ Range(free2) \cap (Mapped2 \cup Deferred2) = {}

(* R5: every extent's refcount is the number of references control holds *)
(* (the ghost held: given by Publish and Split, added by Retain, given up  *)
(* by Release), so a Retain that does not count or a Release that does not *)
(* drop shows.                                                             *)
R5 == \A g \in EIds : extents[g].refcount = held[g]

(* R6: what is gone leaves nothing behind: a copy is absent exactly when  *)
(* it maps no physical page, and a page name with no holder has no copy    *)
(* and no version (its bytes were freed with it).                          *)
R6 == \A n \in Names :
        /\ (state1[n] = "absent") = (phys1[n] = -1)
        /\ (state2[n] = "absent") = (phys2[n] = -1)
        /\ holders[n] = 0 => state1[n] = "absent" /\ state2[n] = "absent" /\ versions[n] = 0

(* O1: every page a live row has computed over has a valid device copy:    *)
(* compute waited for KV_READY.                                            *)
O1 == \A s \in Slots : live[s] => \A i \in 1 .. numTokens[s] : i <= Len(pages[s]) => state1[pages[s][i]] = "valid"

(* O2: an in-flight D2H moves only pages that completed compute wrote.     *)
O2 == \A t \in inflight : transfers[t].kind = "backup" =>
        \A i \in DOMAIN transfers[t].pages : LET n == transfers[t].pages[i].name IN Exists(n) => versions[n] # 0

(* O3: no physical page an in-flight transfer reads or writes is free.     *)
O3 == \A t \in inflight : \A i \in DOMAIN transfers[t].pages : LET m == transfers[t].pages[i] IN
        IF transfers[t].kind = "backup"
          THEN m.src \notin Range(free1) /\ m.dst \notin Range(free2)
          ELSE m.src \notin Range(free2) /\ m.dst \notin Range(free1)

(* O4 (an action property): within an epoch an executed, cancelled or     *)
(* failed batch stays so, and only a prepared batch executes; every        *)
(* compute (a step that writes version tags) is a prepared batch executing *)
(* (so no batch computes twice).  A batch that executes applies its        *)
(* recorded intents to the tier state, in order (compute leaves the tiers  *)
(* alone).                                                                 *)
O4 == [][epoch' = epoch =>
           /\ \A b \in BIds : /\ batches[b].state \in Finished => batches'[b].state = batches[b].state
                              /\ batches'[b].state = "executed" /\ batches[b].state # "executed" => batches[b].state = "prepared"
                              /\ batches[b].state = "prepared" /\ batches'[b].state = "executed"
                                    => Tiers' = AfterIntents(Tiers, batches[b].intents)
           /\ nextVersion' # nextVersion => \E b \in BIds : batches[b].state = "prepared" /\ batches'[b].state = "executed"]_vars

(* O4 on the rows: a batch is on record exactly when its id was issued in  *)
(* the epoch, a prepared batch's rows are live (RequestBusy), and a live   *)
(* row's tokens past its computed count are those its prepared batches     *)
(* reserved, in batch order: with none the row is all computed; the first  *)
(* starts at the computed count, each next where the one before ends, the  *)
(* last at the row's end.  So executing a batch counts its tokens, and a   *)
(* prepared batch is the only way a row grows.  An item that reserved more *)
(* than its one new token attached extents, which only an empty row may    *)
(* (InvalidPlan): attached pages are the row's prefix.                     *)
PreparedOn(s) == {b \in BIds : batches[b].state = "prepared" /\ s \in Range(batches[b].slots)}
StartOf(b, s) == batches[b].startTokens[CHOOSE i \in DOMAIN batches[b].slots : batches[b].slots[i] = s]
EndOf(b, s) == batches[b].ends[CHOOSE i \in DOMAIN batches[b].slots : batches[b].slots[i] = s]
O4_Rows ==
    /\ \A b \in BIds : (batches[b].state # "none") = (b < nextBatch)
    /\ \A b \in BIds : batches[b].state = "prepared" => \A i \in DOMAIN batches[b].slots : live[batches[b].slots[i]]
    /\ \A s \in Slots : live[s] =>
          LET P == PreparedOn(s) IN
          IF P = {} THEN Len(pages[s]) = numTokens[s]
          ELSE /\ \A b \in P : (\A c \in P : b <= c) => StartOf(b, s) = numTokens[s]
               /\ \A b \in P : (\A c \in P : c <= b) => EndOf(b, s) = Len(pages[s])
               /\ \A b, c \in P : b < c /\ (\A d \in P : d <= b \/ c <= d) => StartOf(c, s) = EndOf(b, s)
    /\ \A b \in BIds : \A i \in DOMAIN batches[b].slots :
          batches[b].ends[i] - batches[b].startTokens[i] > 1 => batches[b].startTokens[i] = 0

(* D1: a live extent covers one or more pages, each written (Publish takes *)
(* computed pages only, Split leaves neither half empty), so a row that    *)
(* attaches it reads written bytes; every readable copy (valid or          *)
(* dropping) holds the version tag last written to its page, and every tag *)
(* written is fresh (below the next one), so that a later write never      *)
(* carries an earlier write's tag.                                         *)
D1 == /\ \A g \in EIds : extents[g].refcount > 0 =>
           extents[g].pages # <<>> /\ \A n \in Range(extents[g].pages) : versions[n] # 0
      /\ \A n \in Names : Exists(n) /\ versions[n] # 0 =>
           /\ state1[n] \in Readable => tags1[phys1[n]] = versions[n]
           /\ state2[n] \in Readable => tags2[phys2[n]] = versions[n]
      /\ \A n \in Names : versions[n] < nextVersion
      /\ \A p \in Phys1 : tags1[p] < nextVersion
      /\ \A p \in Phys2 : tags2[p] < nextVersion

(* D1 at the reads: compute of a batch that may run reads, for every token *)
(* of each row, the tag last written there.                                *)
D1_Reads == \A b \in BIds : batches[b].state = "prepared" /\ ExecuteBatchOk(BatchH(b)) /\ KVReady(BatchH(b)) /\ ReadsLanded(BatchH(b)) =>
        \A i \in DOMAIN batches[b].slots : \A j \in 1 .. batches[b].ends[i] - 1 :
            LET n == pages[batches[b].slots[i]][j] IN versions[n] # 0 => tags1[phys1[n]] = versions[n]

(* F1: no page is left without a readable copy by a failed transfer: every *)
(* live page name has a copy valid or dropping in some tier.               *)
F1 == \A n \in Names : Exists(n) => state1[n] \in Readable \/ state2[n] \in Readable

(* F2 (an action property): a step in which batches fail leaves what       *)
(* compute would have written invisible: every row's token count, each row *)
(* of a failed batch as it was before the first of them, every live page's *)
(* versions, the tags every readable copy holds; no version tag is used    *)
(* and no transfer started.                                                *)
FailsNow == {b \in BIds : batches[b].state = "prepared" /\ batches'[b].state = "failed"}
F2 == [][epoch' = epoch /\ FailsNow # {} =>
           /\ numTokens' = numTokens
           /\ \A b \in FailsNow : \A i \in DOMAIN batches[b].slots :
                 LET s == batches[b].slots[i] IN
                 (\A c \in FailsNow : c < b => s \notin Range(batches[c].slots))
                    => pages'[s] = SubSeq(pages[s], 1, batches[b].startTokens[i])
           /\ \A n \in Names : holders'[n] > 0 =>
                 /\ versions'[n] = versions[n]
                 /\ state1'[n] \in Readable => tags1'[phys1'[n]] = tags1[phys1'[n]]
                 /\ state2'[n] \in Readable => tags2'[phys2'[n]] = tags2[phys2'[n]]
           /\ nextVersion' = nextVersion
           /\ nextTransfer' = nextTransfer]_vars

(* F3 (an action property): a lost runtime refuses every operation with    *)
(* RuntimeFault, and no transfer lands or fails: nothing changes until     *)
(* Restart; and a restart recovers: the new epoch begins not lost.         *)
F3 == [][/\ lost /\ epoch' = epoch => UNCHANGED vars
         /\ epoch' # epoch => ~lost']_vars

(* T1: completions are sound: each completion not yet reported names a    *)
(* transfer started in this epoch that left the streams, at most once; a   *)
(* transfer is in flight exactly when it has moves on record; and every    *)
(* transfer started in the epoch is exactly one of in flight, completed    *)
(* and not yet reported, or reported by a poll (the ghost reported), so a  *)
(* completion is never lost, even of a transfer with nothing to move.      *)
Unreported == {unreported[i].transferId : i \in DOMAIN unreported}
T1 == /\ \A i \in DOMAIN unreported : unreported[i].transferId < nextTransfer /\ unreported[i].transferId \notin inflight
      /\ \A i, j \in DOMAIN unreported : i # j => unreported[i].transferId # unreported[j].transferId
      /\ \A t \in TIds : (t \in inflight) = (t < nextTransfer /\ transfers[t].pages # <<>>)
      /\ \A t \in TIds : (t < nextTransfer) = (t \in inflight \cup Unreported \cup reported)
      /\ reported \cap (inflight \cup Unreported) = {}

(* T2: a filling copy has in flight the transfer that fills it (a restore  *)
(* into the device copy's page, a backup into the host copy's page), and a *)
(* dropping copy waits for its page's copy in the other tier, filling.     *)
Fills(t, kind, n, p) == transfers[t].kind = kind /\ \E i \in DOMAIN transfers[t].pages :
                            transfers[t].pages[i].name = n /\ transfers[t].pages[i].dst = p
T2 == \A n \in Names :
        /\ state1[n] = "filling" => \E t \in inflight : Fills(t, "restore", n, phys1[n])
        /\ state2[n] = "filling" => \E t \in inflight : Fills(t, "backup", n, phys2[n])
        /\ state1[n] = "dropping" => state2[n] = "filling"
        /\ state2[n] = "dropping" => state1[n] = "filling"

(* T3 (an action property): a runtime that is not lost restarts only with *)
(* nothing in flight: a restart forgets its transfers, so one still       *)
(* landing would write pages the new epoch hands out again.                *)
T3 == [][epoch' # epoch => inflight = {} \/ lost]_vars

(* T4: a submit the runtime accepts applies its intents: it starts one     *)
(* transfer (its ticket) per Backup and Restore, and leaves the copies the *)
(* last intent asks for on every page of its extent: after Backup a host   *)
(* copy valid or filling, after Restore a device copy valid or filling,    *)
(* after Demote no device copy but a dropping one, after Drop no host copy *)
(* but a dropping one.  An ENABLED predicate, as H3's: no submit step that *)
(* does otherwise is enabled.  Without a host tier every intent raises    *)
(* NoL2, so no transfer ever starts.                                       *)
Tickets(is) == Cardinality({k \in DOMAIN is : is[k].kind \in {"Backup", "Restore"}})
Applied(i) == \A n \in Range(extents[i.extent.generation].pages) :
                 CASE i.kind = "Backup" -> state2'[n] \in Backed
                   [] i.kind = "Restore" -> state1'[n] \in Backed
                   [] i.kind = "Demote" -> state1'[n] \in {"absent", "dropping"}
                   [] i.kind = "Drop" -> state2'[n] \in {"absent", "dropping"}
Accepted(is) == nextTransfer' = nextTransfer + Tickets(is) /\ Applied(is[Len(is)])
T4 == /\ \A g \in LiveExts :
           LET x == ExtH(g)
               one(k) == <<[kind |-> k, extent |-> x]>>
           IN /\ ~ENABLED (SubmitBackup(x) /\ ~Accepted(one("Backup")))
              /\ ~ENABLED (SubmitRestore(x) /\ ~Accepted(one("Restore")))
              /\ ~ENABLED (SubmitDemote(x) /\ ~Accepted(one("Demote")))
              /\ ~ENABLED (SubmitDrop(x) /\ ~Accepted(one("Drop")))
      /\ MaxSubmitIntents >= 2 => \A i, j \in TierIntents : ~ENABLED (Submit(<<i, j>>) /\ ~Accepted(<<i, j>>))
      /\ L2Pages = 0 => nextTransfer = 0

(* The environment's failures are not vacuous: while they are modelled and *)
(* the runtime is up, it can be lost, and a batch that could execute can   *)
(* fail in compute instead.  Without these a model whose failure actions   *)
(* change nothing would pass F2 and F3 for want of a failure.  Two names:  *)
(* TLC evaluates the second's ENABLED (all of FailBatches) about as slowly *)
(* as the rest of a state's checks together, so only a small model checks *)
(* it (tla/README.md).                                                     *)
LossPossible == Faults /\ ~lost => ENABLED (RuntimeLost /\ lost')
ComputeFailurePossible == Faults /\ ~lost =>
    \A b \in BIds : CanExecute(BatchH(b)) => ENABLED (FailCompute(BatchH(b)) /\ batches'[b].state = "failed")

(* Liveness: every started transfer completes (or is discarded by a        *)
(* restart); every prepared batch is eventually executed or cancelled.     *)
TransfersComplete == \A t \in TIds : t \in inflight ~> t \notin inflight
BatchesResolve == \A b \in BIds : batches[b].state = "prepared" ~> batches[b].state # "prepared"
=============================================================================
