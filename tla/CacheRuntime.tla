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
(*  - a plan item attaches at most one extent; a plan carries at most one  *)
(*    Restore intent and no execute-time intents (those are the standalone *)
(*    actions Publish, Submit, Release, CloseRequest applied after it);    *)
(*  - Submit carries one tier intent;                                      *)
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
(* every action argument is a tuple of integers (B2 by construction); they *)
(* are checked on the Python side (cacheruntime.invariants).               *)
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
    MaxRefcount         \* model bound: references to one extent

VARIABLES
    \* Named as the reference model's record fields (spec/glossary.md): a field of a
    \* per-slot or per-page record is a function of the slot or page name; a pool's
    \* fields carry the tier's number (1: device, L1; 2: host, L2).
    epoch,      \* the runtime's epoch; a restart bumps it
    generation,     \* generation[s]: slot s's current generation
    live,       \* live[s]: slot s holds an open request
    pages,          \* pages[s]: the page names slot s's ReqToToken row maps, in token order
    numTokens,      \* numTokens[s]: tokens computed in row s (Len(pages[s]) are reserved)
    holders,    \* holders[n]: live rows and extents that map page name n (0: no such page)
    versions,       \* versions[n]: version tag last written to page n (0: never written)
    state1,         \* state1[n]: page n's device copy, "absent" | "filling" | "valid"
    phys1,          \* phys1[n]: the physical device page of that copy (-1 if none)
    state2,         \* state2[n]: page n's host copy, "absent" | "filling" | "valid"
    phys2,          \* phys2[n]: the physical host page of that copy (-1 if none)
    nextPage,   \* the next page name to issue in this epoch
    free1,      \* the device free list (a queue of physical pages)
    free2,      \* the host free list
    deferred1,      \* deferred1[p]: in-flight transfers a deferred free of device page p waits for
    deferred2,      \* deferred2[p]: the same for host page p
    tags1,          \* tags1[p]: the version tag device page p holds (memory survives frees)
    tags2,          \* tags2[p]: the version tag host page p holds
    extents,        \* extents[g]: extent g's refcount (0: not live) and page names
    nextExtent,    \* the next extent generation to issue in this epoch
    batches,        \* batches[b]: state, slots (in plan order), row lengths before (startTokens) and after (ends)
    nextBatch,  \* the next batch id in this epoch
    transfers,      \* transfers[t]: transfer t: kind, pages <<name, source, destination>>, waitsFor
    inflight,   \* transfers started and not completed (H2D and D2H streams)
    nextTransfer,      \* the next transfer id in this epoch
    unreported,      \* completed transfers not yet reported by a poll, in completion order
    nextVersion     \* the next version tag; never resets, not even at a restart (D1)

vars == <<epoch, generation, live, pages, numTokens, holders, versions, state1, phys1, state2,
          phys2, nextPage, free1, free2, deferred1, deferred2, tags1, tags2, extents, nextExtent,
          batches, nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

-----------------------------------------------------------------------------
(* Sets, canonical values, helpers.                                        *)

Slots == 0 .. MaxRequests - 1
Names == 0 .. MaxNames - 1
Phys1 == 0 .. L1Pages - 1
Phys2 == 0 .. L2Pages - 1
EIds == 1 .. MaxExtents
BIds == 0 .. MaxBatches - 1
TIds == 0 .. MaxTransfers - 1
CopyState == {"absent", "filling", "valid"}
BatchState == {"prepared", "executed", "cancelled"}
Kinds == {"Backup", "Restore", "Demote", "Drop"}
NoExt == <<-1, 0>>                       \* "no extent" in a plan item or restore slot
NoExtent == [refcount |-> 0, pages |-> <<>>]
NoBatch == [state |-> "none", slots |-> <<>>, startTokens |-> <<>>, ends |-> <<>>]
NoTransfer == [kind |-> "none", pages |-> <<>>, waitsFor |-> {}]

Range(s) == {s[i] : i \in DOMAIN s}
Count(s, x) == Cardinality({i \in DOMAIN s : s[i] = x})
Seq0(n) == [i \in 1 .. n |-> i - 1]      \* <<0, 1, ..., n-1>>
RECURSIVE SortedSeq(_)
SortedSeq(S) == IF S = {} THEN <<>>
                ELSE LET m == CHOOSE v \in S : \A w \in S : v <= w
                     IN <<m>> \o SortedSeq(S \ {m})
RECURSIVE Concat(_)
Concat(ss) == IF ss = <<>> THEN <<>> ELSE Head(ss) \o Concat(Tail(ss))

-----------------------------------------------------------------------------
(* Handles.  A request handle is <<epoch, slot, generation>>, an extent    *)
(* ref <<epoch, generation>>, a batch handle <<epoch, batch id>>.          *)

ValidReq(h) == /\ h[1] = epoch
               /\ h[2] \in Slots
               /\ h[3] = generation[h[2]]
               /\ live[h[2]]
ValidExt(x) == /\ x[1] = epoch
               /\ x[2] \in EIds
               /\ extents[x[2]].refcount > 0
ValidBatch(bh) == /\ bh[1] = epoch
                  /\ bh[2] \in BIds
                  /\ bh[2] < nextBatch

Exists(n) == holders[n] > 0
InPrepared(s) == \E b \in BIds : batches[b].state = "prepared" /\ s \in Range(batches[b].slots)
RowHeld == UNION {Range(pages[s]) : s \in {s2 \in Slots : live[s2]}}

(* Transfers that read or write physical page p of a tier.                 *)
Touch1(p) == {t \in inflight : \E i \in DOMAIN transfers[t].pages :
                 \/ transfers[t].kind = "backup" /\ transfers[t].pages[i][2] = p
                 \/ transfers[t].kind = "restore" /\ transfers[t].pages[i][3] = p}
Touch2(p) == {t \in inflight : \E i \in DOMAIN transfers[t].pages :
                 \/ transfers[t].kind = "backup" /\ transfers[t].pages[i][3] = p
                 \/ transfers[t].kind = "restore" /\ transfers[t].pages[i][2] = p}

(* Freeing physical pages ps (a sequence) of a tier: each goes to the end  *)
(* of the free list, or, while a transfer touches it, is deferred until    *)
(* that transfer completes (O3).                                           *)
Free1After(ps) == LET ok(p) == Touch1(p) = {} IN free1 \o SelectSeq(ps, ok)
Deferred1After(ps) == [p \in Phys1 |-> IF p \in Range(ps) /\ Touch1(p) # {} THEN Touch1(p) ELSE deferred1[p]]
Free2After(ps) == LET ok(p) == Touch2(p) = {} IN free2 \o SelectSeq(ps, ok)
Deferred2After(ps) == [p \in Phys2 |-> IF p \in Range(ps) /\ Touch2(p) # {} THEN Touch2(p) ELSE deferred2[p]]

(* Every page name of sequence S loses one holder; a page whose count     *)
(* reaches 0 ends: its copies are freed (or deferred), in the order the    *)
(* pages end.                                                              *)
Ending(S) == {n \in Range(S) : holders[n] = Count(S, n)}
EndSeq(S) == LET last(i) == S[i] \in Ending(S) /\ \A j \in DOMAIN S : j > i => S[j] # S[i]
                 idx == SelectSeq([i \in 1 .. Len(S) |-> i], last)
             IN [k \in 1 .. Len(idx) |-> S[idx[k]]]
PhysSeq1(ns) == LET has(n) == state1[n] # "absent" IN
                LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> phys1[hs[i]]]
PhysSeq2(ns) == LET has(n) == state2[n] # "absent" IN
                LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> phys2[hs[i]]]
DropHolders(S) ==
    LET E == Ending(S)
        es == EndSeq(S)
    IN /\ holders' = [n \in Names |-> holders[n] - Count(S, n)]
       /\ versions' = [n \in Names |-> IF n \in E THEN 0 ELSE versions[n]]
       /\ state1' = [n \in Names |-> IF n \in E THEN "absent" ELSE state1[n]]
       /\ phys1' = [n \in Names |-> IF n \in E THEN -1 ELSE phys1[n]]
       /\ state2' = [n \in Names |-> IF n \in E THEN "absent" ELSE state2[n]]
       /\ phys2' = [n \in Names |-> IF n \in E THEN -1 ELSE phys2[n]]
       /\ free1' = Free1After(PhysSeq1(es))
       /\ deferred1' = Deferred1After(PhysSeq1(es))
       /\ free2' = Free2After(PhysSeq2(es))
       /\ deferred2' = Deferred2After(PhysSeq2(es))

(* The pages of extent g a restore moves: those without a device copy.     *)
RestorePages(g) == LET none(n) == state1[n] = "absent" IN SelectSeq(extents[g].pages, none)
(* The pages of extent g a backup moves: those without a host copy.        *)
BackupPages(g) == LET none(n) == state2[n] = "absent" IN SelectSeq(extents[g].pages, none)

-----------------------------------------------------------------------------
TypeOK ==
    /\ epoch \in 0 .. MaxEpoch
    /\ generation \in [Slots -> 0 .. MaxGeneration]
    /\ live \in [Slots -> BOOLEAN]
    /\ \A s \in Slots : pages[s] \in Seq(Names) /\ Len(pages[s]) <= MaxRequestTokens
    /\ numTokens \in [Slots -> 0 .. MaxRequestTokens]
    /\ holders \in [Names -> Nat] /\ versions \in [Names -> Nat]
    /\ state1 \in [Names -> CopyState] /\ state2 \in [Names -> CopyState]
    /\ phys1 \in [Names -> Phys1 \cup {-1}] /\ phys2 \in [Names -> Phys2 \cup {-1}]
    /\ nextPage \in 0 .. MaxNames
    /\ free1 \in Seq(Phys1) /\ free2 \in Seq(Phys2)
    /\ deferred1 \in [Phys1 -> SUBSET TIds] /\ deferred2 \in [Phys2 -> SUBSET TIds]
    /\ tags1 \in [Phys1 -> Nat] /\ tags2 \in [Phys2 -> Nat]
    /\ \A g \in EIds : extents[g].refcount \in 0 .. MaxRefcount /\ extents[g].pages \in Seq(Names)
    /\ nextExtent \in 1 .. MaxExtents + 1
    /\ \A b \in BIds : batches[b].state \in {"none"} \cup BatchState
    /\ nextBatch \in 0 .. MaxBatches
    /\ \A t \in TIds : transfers[t].kind \in {"none", "backup", "restore"}
    /\ inflight \subseteq TIds
    /\ nextTransfer \in 0 .. MaxTransfers
    /\ unreported \in Seq(TIds)
    /\ nextVersion \in Nat \ {0}

Init ==
    /\ epoch = 0
    /\ generation = [s \in Slots |-> 0]
    /\ live = [s \in Slots |-> FALSE]
    /\ pages = [s \in Slots |-> <<>>]
    /\ numTokens = [s \in Slots |-> 0]
    /\ holders = [n \in Names |-> 0]
    /\ versions = [n \in Names |-> 0]
    /\ state1 = [n \in Names |-> "absent"]
    /\ phys1 = [n \in Names |-> -1]
    /\ state2 = [n \in Names |-> "absent"]
    /\ phys2 = [n \in Names |-> -1]
    /\ nextPage = 0
    /\ free1 = Seq0(L1Pages)
    /\ free2 = Seq0(L2Pages)
    /\ deferred1 = [p \in Phys1 |-> {}]
    /\ deferred2 = [p \in Phys2 |-> {}]
    /\ tags1 = [p \in Phys1 |-> 0]
    /\ tags2 = [p \in Phys2 |-> 0]
    /\ extents = [g \in EIds |-> NoExtent]
    /\ nextExtent = 1
    /\ batches = [b \in BIds |-> NoBatch]
    /\ nextBatch = 0
    /\ transfers = [t \in TIds |-> NoTransfer]
    /\ inflight = {}
    /\ nextTransfer = 0
    /\ unreported = <<>>
    /\ nextVersion = 1

-----------------------------------------------------------------------------
(* OpenRequest: the lowest-numbered slot that is not live becomes live     *)
(* with an empty row, at its current generation (OutOfSlots otherwise).   *)
OpenRequest ==
    /\ \E s \in Slots : ~live[s]
    /\ LET s == CHOOSE v \in Slots : ~live[v] /\ \A w \in Slots : ~live[w] => v <= w
       IN /\ live' = [live EXCEPT ![s] = TRUE]
          /\ pages' = [pages EXCEPT ![s] = <<>>]
          /\ numTokens' = [numTokens EXCEPT ![s] = 0]
    /\ UNCHANGED <<epoch, generation, holders, versions, state1, phys1, state2, phys2, nextPage,
                   free1, free2, deferred1, deferred2, tags1, tags2, extents, nextExtent, batches,
                   nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* CloseRequest: the slot stops being live and its generation grows at    *)
(* once (H2); every page its row maps loses a holder (RequestBusy while    *)
(* the request is in a prepared batch).                                    *)
CloseRequest(h) ==
    /\ ValidReq(h)
    /\ ~InPrepared(h[2])
    /\ generation[h[2]] < MaxGeneration                                        \* model bound
    /\ LET s == h[2] IN
       /\ live' = [live EXCEPT ![s] = FALSE]
       /\ generation' = [generation EXCEPT ![s] = @ + 1]
       /\ pages' = [pages EXCEPT ![s] = <<>>]
       /\ numTokens' = [numTokens EXCEPT ![s] = 0]
       /\ DropHolders(pages[s])
    /\ UNCHANGED <<epoch, nextPage, tags1, tags2, extents, nextExtent, batches, nextBatch,
                   transfers, inflight, nextTransfer, unreported, nextVersion>>

(* PrepareBatch: validate a plan, start its restore, map attached extents  *)
(* to the front of their rows and allocate one new page per item; nothing *)
(* changes if any check fails (InvalidPlan, NotBackedUp, NotResident,     *)
(* RowFull, OutOfPages).  A plan is [items |-> <<<<req, extent ref or      *)
(* NoExt>>, ...>>, restore |-> extent ref or NoExt].                       *)
PrepareBatch(P) ==
    LET its == P.items
        k == Len(its)
        slot(i) == its[i][1][2]
        att(i) == its[i][2]
        attPages(i) == IF att(i) = NoExt THEN <<>> ELSE extents[att(i)[2]].pages
        rx == P.restore
        rs == IF rx = NoExt THEN <<>> ELSE RestorePages(rx[2])
        r == Len(rs)
        end(i) == Len(pages[slot(i)]) + Len(attPages(i)) + 1
        newName(i) == nextPage + i - 1
        newNames == {newName(i) : i \in 1 .. k}
        item(s) == CHOOSE i \in 1 .. k : slot(i) = s
        attached == Concat([i \in 1 .. k |-> attPages(i)])
        t == nextTransfer
    IN
    \* handle checks and preconditions, in the model's order
    /\ k >= 1
    /\ \A i \in 1 .. k : ValidReq(its[i][1]) /\ (att(i) = NoExt \/ ValidExt(att(i)))
    /\ rx = NoExt \/ (ValidExt(rx) /\ L2Pages > 0)
    /\ \A i, j \in 1 .. k : i # j => slot(i) # slot(j)
    /\ \A i \in 1 .. r : state2[rs[i]] # "absent"                       \* NotBackedUp
    /\ \A i \in 1 .. k : att(i) # NoExt => Len(pages[slot(i)]) = 0      \* InvalidPlan
    /\ \A i \in 1 .. k : \A n \in Range(attPages(i)) :
          state1[n] # "absent" \/ n \in Range(rs)                       \* NotResident
    /\ \A i \in 1 .. k : end(i) <= MaxRequestTokens                         \* RowFull
    /\ k + r <= Len(free1)                                              \* OutOfPages(L1)
    /\ nextBatch < MaxBatches /\ nextPage + k <= MaxNames               \* model bounds
    /\ rx # NoExt => nextTransfer < MaxTransfers
    \* effects: the restore (H2D) starts on the first r free device pages
    /\ IF rx = NoExt
         THEN UNCHANGED <<transfers, inflight, nextTransfer, unreported>>
       ELSE IF r = 0
         THEN /\ nextTransfer' = t + 1                                  \* nothing to move: completes at once
              /\ unreported' = Append(unreported, t)
              /\ UNCHANGED <<transfers, inflight>>
       ELSE /\ transfers' = [transfers EXCEPT ![t] =
                 [kind |-> "restore",
                  pages |-> [i \in 1 .. r |-> <<rs[i], phys2[rs[i]], free1[i]>>],
                  waitsFor |-> UNION {IF state2[rs[i]] = "filling" THEN Touch2(phys2[rs[i]]) ELSE {} : i \in 1 .. r}]]
            /\ inflight' = inflight \cup {t}
            /\ nextTransfer' = t + 1
            /\ UNCHANGED unreported
    \* attached pages gain a holder; new pages are named and placed after them
    /\ pages' = [s \in Slots |-> IF \E i \in 1 .. k : slot(i) = s
                               THEN pages[s] \o attPages(item(s)) \o <<newName(item(s))>>
                               ELSE pages[s]]
    /\ holders' = [n \in Names |-> IF n \in newNames THEN 1 ELSE holders[n] + Count(attached, n)]
    /\ state1' = [n \in Names |-> IF n \in newNames THEN "valid"
                              ELSE IF n \in Range(rs) THEN "filling" ELSE state1[n]]
    /\ phys1' = [n \in Names |-> IF n \in newNames THEN free1[r + n - nextPage + 1]
                              ELSE IF n \in Range(rs)
                                   THEN free1[CHOOSE i \in 1 .. r : rs[i] = n]
                                   ELSE phys1[n]]
    /\ free1' = SubSeq(free1, r + k + 1, Len(free1))
    /\ nextPage' = nextPage + k
    /\ batches' = [batches EXCEPT ![nextBatch] =
                    [state |-> "prepared",
                     slots |-> [i \in 1 .. k |-> slot(i)],
                     startTokens |-> [i \in 1 .. k |-> Len(pages[slot(i)])],
                     ends |-> [i \in 1 .. k |-> end(i)]]]
    /\ nextBatch' = nextBatch + 1
    /\ UNCHANGED <<epoch, generation, live, numTokens, versions, state2, phys2, free2, deferred1,
                   deferred2, tags1, tags2, extents, nextExtent, nextVersion>>

(* ExecuteBatch: compute, once it may (KV_READY: no H2D into a page it     *)
(* reads is in flight, O1), writes each item's token with the next version *)
(* tag; the batch is executed and never runs again (O4).  Not enabled if   *)
(* executed (AlreadyExecuted), cancelled (NotPrepared) or if an earlier    *)
(* prepared batch shares a request (OutOfOrder).                           *)
ExecuteBatchOk(bh) ==
    /\ ValidBatch(bh)
    /\ batches[bh[2]].state = "prepared"
    /\ \A c \in BIds : c < bh[2] /\ batches[c].state = "prepared"
          => Range(batches[c].slots) \cap Range(batches[bh[2]].slots) = {}
KVReady(bh) ==
    LET B == batches[bh[2]]
        reads == UNION {{pages[B.slots[i]][j] : j \in 1 .. B.ends[i]} : i \in DOMAIN B.slots}
    IN \A t \in inflight : transfers[t].kind = "restore" =>
          \A i \in DOMAIN transfers[t].pages : transfers[t].pages[i][1] \notin reads
ExecuteBatch(bh) ==
    LET b == bh[2]
        B == batches[b]
        k == Len(B.slots)
        written(i) == pages[B.slots[i]][B.ends[i]]
        wrote == {written(i) : i \in 1 .. k}
        idx(n) == CHOOSE i \in 1 .. k : written(i) = n
        physIdx(p) == CHOOSE i \in 1 .. k : phys1[written(i)] = p
    IN
    /\ ExecuteBatchOk(bh)
    /\ KVReady(bh)
    /\ versions' = [n \in Names |-> IF n \in wrote THEN nextVersion + idx(n) - 1 ELSE versions[n]]
    /\ tags1' = [p \in Phys1 |-> IF \E i \in 1 .. k : phys1[written(i)] = p
                              THEN nextVersion + physIdx(p) - 1 ELSE tags1[p]]
    /\ numTokens' = [s \in Slots |-> IF s \in Range(B.slots)
                                THEN B.ends[CHOOSE i \in 1 .. k : B.slots[i] = s]
                                ELSE numTokens[s]]
    /\ batches' = [batches EXCEPT ![b].state = "executed"]
    /\ nextVersion' = nextVersion + k
    /\ UNCHANGED <<epoch, generation, live, pages, holders, state1, phys1, state2, phys2, nextPage,
                   free1, free2, deferred1, deferred2, tags2, extents, nextExtent, nextBatch,
                   transfers, inflight, nextTransfer, unreported>>

(* CancelBatch: the batch's new and attached pages lose their holder and   *)
(* rows return to their previous length; restores it started go on.  Not  *)
(* enabled if executed, cancelled, or a later prepared batch shares a      *)
(* request (BatchDependency).                                              *)
CancelBatch(bh) ==
    LET b == bh[2]
        B == batches[b]
        k == Len(B.slots)
        dropped == Concat([i \in 1 .. k |-> SubSeq(pages[B.slots[i]], B.startTokens[i] + 1, Len(pages[B.slots[i]]))])
    IN
    /\ ValidBatch(bh)
    /\ B.state = "prepared"
    /\ \A c \in BIds : c > b /\ batches[c].state = "prepared" => Range(batches[c].slots) \cap Range(B.slots) = {}
    /\ pages' = [s \in Slots |-> IF s \in Range(B.slots)
                               THEN SubSeq(pages[s], 1, B.startTokens[CHOOSE i \in 1 .. k : B.slots[i] = s])
                               ELSE pages[s]]
    /\ DropHolders(dropped)
    /\ batches' = [batches EXCEPT ![b].state = "cancelled"]
    /\ UNCHANGED <<epoch, generation, live, numTokens, nextPage, tags1, tags2, extents, nextExtent,
                   nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* Publish: full computed pages first..first+count-1 of a row become a new *)
(* extent with one reference; each page gains a holder (InvalidPageRun).   *)
Publish(h, first, count) ==
    LET s == h[2]
        ps == SubSeq(pages[s], first + 1, first + count)
    IN
    /\ ValidReq(h)
    /\ count >= 1 /\ first >= 0 /\ first + count <= numTokens[s]
    /\ nextExtent <= MaxExtents                                         \* model bound
    /\ holders' = [n \in Names |-> holders[n] + Count(ps, n)]
    /\ extents' = [extents EXCEPT ![nextExtent] = [refcount |-> 1, pages |-> ps]]
    /\ nextExtent' = nextExtent + 1
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, versions, state1, phys1, state2,
                   phys2, nextPage, free1, free2, deferred1, deferred2, tags1, tags2, batches,
                   nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* Split: an extent with one reference ends and two new extents            *)
(* cover its first `at` pages and the rest; holders do not change          *)
(* (ExtentShared, InvalidPageRun).                                         *)
Split(x, at) ==
    LET g == x[2]
        ps == extents[g].pages
    IN
    /\ ValidExt(x)
    /\ extents[g].refcount = 1
    /\ 0 < at /\ at < Len(ps)
    /\ nextExtent + 1 <= MaxExtents                                     \* model bound
    /\ extents' = [extents EXCEPT ![g] = NoExtent,
                          ![nextExtent] = [refcount |-> 1, pages |-> SubSeq(ps, 1, at)],
                          ![nextExtent + 1] = [refcount |-> 1, pages |-> SubSeq(ps, at + 1, Len(ps))]]
    /\ nextExtent' = nextExtent + 2
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, holders, versions, state1, phys1,
                   state2, phys2, nextPage, free1, free2, deferred1, deferred2, tags1, tags2,
                   batches, nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* Retain: a live extent gains a reference.                                *)
Retain(x) ==
    /\ ValidExt(x)
    /\ extents[x[2]].refcount < MaxRefcount                                  \* model bound
    /\ extents' = [extents EXCEPT ![x[2]].refcount = @ + 1]
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, holders, versions, state1, phys1,
                   state2, phys2, nextPage, free1, free2, deferred1, deferred2, tags1, tags2,
                   nextExtent, batches, nextBatch, transfers, inflight, nextTransfer, unreported,
                   nextVersion>>

(* Release: a live extent loses a reference; with the last one it ends and *)
(* each of its pages loses a holder (a released ref is stale: R4).         *)
Release(x) ==
    LET g == x[2] IN
    /\ ValidExt(x)
    /\ IF extents[g].refcount = 1
         THEN /\ extents' = [extents EXCEPT ![g] = NoExtent]
              /\ DropHolders(extents[g].pages)
         ELSE /\ extents' = [extents EXCEPT ![g].refcount = @ - 1]
              /\ UNCHANGED <<holders, versions, state1, phys1, state2, phys2, free1, free2,
                             deferred1, deferred2>>
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, nextPage, tags1, tags2, nextExtent,
                   batches, nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* Submit: one tier intent on a live extent (NoL2 without a host tier).    *)
(*  Backup: pages without a host copy get one (filling) and a D2H starts,  *)
(*    ordered after the compute that wrote them (OutOfPages(L2)).          *)
(*  Restore: pages without a device copy get one (filling) and an H2D      *)
(*    starts, after any D2H still filling its source (NotBackedUp,         *)
(*    OutOfPages(L1)).                                                     *)
(*  Demote: drop the device copies; needs a host copy of every page and no *)
(*    live row mapping one (NotBackedUp, ExtentInUse).                     *)
(*  Drop: drop the host copies; needs a device copy of every page          *)
(*    (WouldLoseData).                                                     *)
StartTransfer(kind, ms, ws) ==
    /\ nextTransfer < MaxTransfers                                      \* model bound
    /\ nextTransfer' = nextTransfer + 1
    /\ IF ms = <<>>
         THEN /\ unreported' = Append(unreported, nextTransfer)         \* nothing to move: completes at once
              /\ UNCHANGED <<transfers, inflight>>
         ELSE /\ transfers' = [transfers EXCEPT ![nextTransfer] = [kind |-> kind, pages |-> ms, waitsFor |-> ws]]
              /\ inflight' = inflight \cup {nextTransfer}
              /\ UNCHANGED unreported

Submit(kind, x) ==
    LET g == x[2]
        ps == extents[g].pages
        bs == BackupPages(g)
        rs == RestorePages(g)
    IN
    /\ ValidExt(x)
    /\ L2Pages > 0
    /\ CASE kind = "Backup" ->
              /\ Len(bs) <= Len(free2)                                  \* OutOfPages(L2)
              /\ StartTransfer("backup",
                    [i \in 1 .. Len(bs) |-> <<bs[i], phys1[bs[i]], free2[i]>>],
                    UNION {IF state1[bs[i]] = "filling" THEN Touch1(phys1[bs[i]]) ELSE {} : i \in 1 .. Len(bs)})
              /\ state2' = [n \in Names |-> IF n \in Range(bs) THEN "filling" ELSE state2[n]]
              /\ phys2' = [n \in Names |-> IF n \in Range(bs)
                                        THEN free2[CHOOSE i \in 1 .. Len(bs) : bs[i] = n]
                                        ELSE phys2[n]]
              /\ free2' = SubSeq(free2, Len(bs) + 1, Len(free2))
              /\ UNCHANGED <<state1, phys1, free1, deferred1, deferred2>>
         [] kind = "Restore" ->
              /\ \A n \in Range(rs) : state2[n] # "absent"              \* NotBackedUp
              /\ Len(rs) <= Len(free1)                                  \* OutOfPages(L1)
              /\ StartTransfer("restore",
                    [i \in 1 .. Len(rs) |-> <<rs[i], phys2[rs[i]], free1[i]>>],
                    UNION {IF state2[rs[i]] = "filling" THEN Touch2(phys2[rs[i]]) ELSE {} : i \in 1 .. Len(rs)})
              /\ state1' = [n \in Names |-> IF n \in Range(rs) THEN "filling" ELSE state1[n]]
              /\ phys1' = [n \in Names |-> IF n \in Range(rs)
                                        THEN free1[CHOOSE i \in 1 .. Len(rs) : rs[i] = n]
                                        ELSE phys1[n]]
              /\ free1' = SubSeq(free1, Len(rs) + 1, Len(free1))
              /\ UNCHANGED <<state2, phys2, free2, deferred1, deferred2>>
         [] kind = "Demote" ->
              /\ \A n \in Range(ps) : state2[n] # "absent"              \* NotBackedUp
              /\ Range(ps) \cap RowHeld = {}                            \* ExtentInUse
              /\ state1' = [n \in Names |-> IF n \in Range(ps) THEN "absent" ELSE state1[n]]
              /\ phys1' = [n \in Names |-> IF n \in Range(ps) THEN -1 ELSE phys1[n]]
              /\ free1' = Free1After(PhysSeq1(ps))
              /\ deferred1' = Deferred1After(PhysSeq1(ps))
              /\ UNCHANGED <<state2, phys2, free2, deferred2, transfers, inflight, nextTransfer,
                             unreported>>
         [] kind = "Drop" ->
              /\ \A n \in Range(ps) : state1[n] # "absent"              \* WouldLoseData
              /\ state2' = [n \in Names |-> IF n \in Range(ps) THEN "absent" ELSE state2[n]]
              /\ phys2' = [n \in Names |-> IF n \in Range(ps) THEN -1 ELSE phys2[n]]
              /\ free2' = Free2After(PhysSeq2(ps))
              /\ deferred2' = Deferred2After(PhysSeq2(ps))
              /\ UNCHANGED <<state1, phys1, free1, deferred1, transfers, inflight, nextTransfer,
                             unreported>>
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, holders, versions, nextPage, tags1,
                   tags2, extents, nextExtent, batches, nextBatch, nextVersion>>

(* PollCompletions: the completions not yet reported are reported, once.   *)
PollCompletions ==
    /\ unreported' = <<>>
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, holders, versions, state1, phys1,
                   state2, phys2, nextPage, free1, free2, deferred1, deferred2, tags1, tags2,
                   extents, nextExtent, batches, nextBatch, transfers, inflight, nextTransfer,
                   nextVersion>>

(* WaitCompletions: blocks until no transfer is in flight (the environment *)
(* completes them), then reports as PollCompletions does.                  *)
WaitCompletions ==
    /\ inflight = {}
    /\ PollCompletions

(* Restart: drains the transfers in flight (enabled once the environment  *)
(* has completed them: their copies land), then everything is forgotten;   *)
(* live slots' generations and the epoch grow, so every handle is stale   *)
(* (scenario 5); version tags and the tags memory holds carry on (D1).     *)
Restart ==
    /\ inflight = {}
    /\ epoch < MaxEpoch /\ \A s \in Slots : live[s] => generation[s] < MaxGeneration  \* model bounds
    /\ epoch' = epoch + 1
    /\ generation' = [s \in Slots |-> IF live[s] THEN generation[s] + 1 ELSE generation[s]]
    /\ live' = [s \in Slots |-> FALSE]
    /\ pages' = [s \in Slots |-> <<>>]
    /\ numTokens' = [s \in Slots |-> 0]
    /\ holders' = [n \in Names |-> 0]
    /\ versions' = [n \in Names |-> 0]
    /\ state1' = [n \in Names |-> "absent"]
    /\ phys1' = [n \in Names |-> -1]
    /\ state2' = [n \in Names |-> "absent"]
    /\ phys2' = [n \in Names |-> -1]
    /\ nextPage' = 0
    /\ free1' = Seq0(L1Pages)
    /\ free2' = Seq0(L2Pages)
    /\ deferred1' = [p \in Phys1 |-> {}]
    /\ deferred2' = [p \in Phys2 |-> {}]
    /\ extents' = [g \in EIds |-> NoExtent]
    /\ nextExtent' = 1
    /\ batches' = [b \in BIds |-> NoBatch]
    /\ nextBatch' = 0
    /\ transfers' = [t \in TIds |-> NoTransfer]
    /\ inflight' = {}
    /\ nextTransfer' = 0
    /\ unreported' = <<>>
    /\ UNCHANGED <<tags1, tags2, nextVersion>>

(* CompleteTransfer (environment): a transfer whose predecessors have      *)
(* completed lands: its destinations receive the sources' tags, copies it  *)
(* filled become valid, and deferred frees that waited only on it run.     *)
CompleteTransfer(t) ==
    LET ms == transfers[t].pages
        bk == transfers[t].kind = "backup"
        dsts == {ms[i][3] : i \in DOMAIN ms}
        srcOf(d) == ms[CHOOSE i \in DOMAIN ms : ms[i][3] = d][2]
        filled(n, p) == \E i \in DOMAIN ms : ms[i][1] = n /\ ms[i][3] = p
        rel1 == {p \in Phys1 : deferred1[p] = {t}}
        rel2 == {p \in Phys2 : deferred2[p] = {t}}
    IN
    /\ t \in inflight
    /\ transfers[t].waitsFor \cap inflight = {}
    /\ IF bk
         THEN /\ tags2' = [p \in Phys2 |-> IF p \in dsts THEN tags1[srcOf(p)] ELSE tags2[p]]
              /\ state2' = [n \in Names |-> IF Exists(n) /\ state2[n] # "absent" /\ filled(n, phys2[n])
                                        THEN "valid" ELSE state2[n]]
              /\ UNCHANGED <<tags1, state1>>
         ELSE /\ tags1' = [p \in Phys1 |-> IF p \in dsts THEN tags2[srcOf(p)] ELSE tags1[p]]
              /\ state1' = [n \in Names |-> IF Exists(n) /\ state1[n] # "absent" /\ filled(n, phys1[n])
                                        THEN "valid" ELSE state1[n]]
              /\ UNCHANGED <<tags2, state2>>
    /\ deferred1' = [p \in Phys1 |-> deferred1[p] \ {t}]
    /\ deferred2' = [p \in Phys2 |-> deferred2[p] \ {t}]
    /\ free1' = free1 \o SortedSeq(rel1)
    /\ free2' = free2 \o SortedSeq(rel2)
    /\ inflight' = inflight \ {t}
    /\ transfers' = [transfers EXCEPT ![t] = NoTransfer]
    /\ unreported' = Append(unreported, t)
    /\ UNCHANGED <<epoch, generation, live, pages, numTokens, holders, versions, phys1, phys2,
                   nextPage, extents, nextExtent, batches, nextBatch, nextTransfer, nextVersion>>

-----------------------------------------------------------------------------
(* The next-state relation: control calls every operation with current     *)
(* handles (a stale handle enables nothing: H1 below checks it), the       *)
(* environment completes transfers.                                        *)

ReqH(s) == <<epoch, s, generation[s]>>
ExtH(g) == <<epoch, g>>
LiveExts == {g \in EIds : extents[g].refcount > 0}
AttachChoices == {NoExt} \cup {ExtH(g) : g \in LiveExts}
Plans ==
    UNION {{[items |-> [i \in 1 .. Len(ss) |-> <<ReqH(ss[i]), a[i]>>], restore |-> rx] :
               a \in [1 .. Len(ss) -> AttachChoices], rx \in AttachChoices} :
           ss \in {SortedSeq(S) : S \in (SUBSET {s \in Slots : live[s]}) \ {{}}}}

Next ==
    \/ OpenRequest
    \/ \E s \in Slots : CloseRequest(ReqH(s))
    \/ \E P \in Plans : PrepareBatch(P)
    \/ \E b \in BIds : ExecuteBatch(<<epoch, b>>) \/ CancelBatch(<<epoch, b>>)
    \/ \E s \in Slots, f \in 0 .. MaxRequestTokens - 1, c \in 1 .. MaxRequestTokens : Publish(ReqH(s), f, c)
    \/ \E g \in LiveExts :
          \/ Retain(ExtH(g))
          \/ Release(ExtH(g))
          \/ \E at \in 1 .. MaxRequestTokens : Split(ExtH(g), at)
          \/ \E kind \in Kinds : Submit(kind, ExtH(g))
    \/ PollCompletions
    \/ WaitCompletions
    \/ Restart
    \/ \E t \in TIds : CompleteTransfer(t)

Spec == Init /\ [][Next]_vars

(* For model checking only (the VIEW of the MC configs): the bytes of a    *)
(* physical page that no valid copy maps and no in-flight transfer reads   *)
(* are never read again before being overwritten, so states that differ   *)
(* only there behave alike.                                                *)
Read1 == {phys1[n] : n \in {m \in Names : state1[m] = "valid"}}
         \cup UNION {{transfers[t].pages[i][2] : i \in DOMAIN transfers[t].pages} :
                     t \in {u \in inflight : transfers[u].kind = "backup"}}
Read2 == {phys2[n] : n \in {m \in Names : state2[m] = "valid"}}
         \cup UNION {{transfers[t].pages[i][2] : i \in DOMAIN transfers[t].pages} :
                     t \in {u \in inflight : transfers[u].kind = "restore"}}
View == <<epoch, generation, live, pages, numTokens, holders, versions, state1, phys1, state2,
          phys2, nextPage, free1, free2, deferred1, deferred2,
          [p \in Phys1 |-> IF p \in Read1 THEN tags1[p] ELSE 0],
          [p \in Phys2 |-> IF p \in Read2 THEN tags2[p] ELSE 0], extents, nextExtent, batches,
          nextBatch, transfers, inflight, nextTransfer, unreported, nextVersion>>

(* Liveness: the environment completes every transfer it can and control   *)
(* executes every batch it can.                                            *)
Fairness ==
    /\ \A t \in TIds : WF_vars(CompleteTransfer(t))
    /\ \A b \in BIds : WF_vars(ExecuteBatch(<<epoch, b>>))
LiveSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Invariants, named by catalogue id (spec/invariants.md).                 *)

ReqHandles == (0 .. MaxEpoch) \X Slots \X (0 .. MaxGeneration)
StaleReq(h) == h[1] < epoch \/ (h[1] = epoch /\ h[3] < generation[h[2]])
StaleExt(x) == x[1] < epoch \/ (x[1] = epoch /\ x[2] < nextExtent /\ extents[x[2]].refcount = 0)
StaleBatch(bh) == bh[1] < epoch

(* H1: no operation given a stale handle is enabled: it changes nothing.   *)
H1_StaleRequestHandle ==
    \A h \in ReqHandles : StaleReq(h) =>
        /\ ~ENABLED CloseRequest(h)
        /\ ~ENABLED Publish(h, 0, 1)
        /\ ~ENABLED PrepareBatch([items |-> <<<<h, NoExt>>>>, restore |-> NoExt])
H1_StaleExtentRef ==
    \A x \in (0 .. MaxEpoch) \X EIds : StaleExt(x) =>
        /\ ~ENABLED Retain(x)
        /\ ~ENABLED Release(x)
        /\ ~ENABLED Split(x, 1)
        /\ \A kind \in Kinds : ~ENABLED Submit(kind, x)
H1_StaleBatchHandle ==
    \A bh \in (0 .. MaxEpoch) \X BIds : StaleBatch(bh) =>
        ~ENABLED ExecuteBatch(bh) /\ ~ENABLED CancelBatch(bh)
H1 == H1_StaleRequestHandle /\ H1_StaleExtentRef /\ H1_StaleBatchHandle

(* H2 (an action property): generations never decrease, and a slot that   *)
(* stops being live moves to a new generation.                             *)
H2 == [][\A s \in Slots : /\ generation'[s] >= generation[s]
                          /\ (live[s] /\ ~live'[s]) => generation'[s] > generation[s]]_vars

(* H3: at most one request handle per slot is current.                     *)
H3 == \A s \in Slots : Cardinality({h \in ReqHandles : h[2] = s /\ ValidReq(h)}) <= 1

Mapped1 == {phys1[n] : n \in {m \in Names : state1[m] # "absent"}}
Mapped2 == {phys2[n] : n \in {m \in Names : state2[m] # "absent"}}
Deferred1 == {p \in Phys1 : deferred1[p] # {}}
Deferred2 == {p \in Phys2 : deferred2[p] # {}}
CopiesOf1(p) == Cardinality({n \in Names : state1[n] # "absent" /\ phys1[n] = p})
CopiesOf2(p) == Cardinality({n \in Names : state2[n] # "absent" /\ phys2[n] = p})

(* R1: every physical page is exactly one of free, mapped to one page      *)
(* name's copy, or deferred; free + held = total, in both pools.           *)
R1 == /\ \A p \in Phys1 : Count(free1, p) + CopiesOf1(p) + (IF p \in Deferred1 THEN 1 ELSE 0) = 1
      /\ \A p \in Phys2 : Count(free2, p) + CopiesOf2(p) + (IF p \in Deferred2 THEN 1 ELSE 0) = 1

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

(* O1: every page a live row has computed over has a valid device copy:    *)
(* compute waited for KV_READY.                                            *)
O1 == \A s \in Slots : live[s] => \A i \in 1 .. numTokens[s] : i <= Len(pages[s]) => state1[pages[s][i]] = "valid"

(* O2: an in-flight D2H moves only pages that completed compute wrote.     *)
O2 == \A t \in inflight : transfers[t].kind = "backup" =>
        \A i \in DOMAIN transfers[t].pages : Exists(transfers[t].pages[i][1]) => versions[transfers[t].pages[i][1]] # 0

(* O3: no physical page an in-flight transfer reads or writes is free.     *)
O3 == \A t \in inflight : \A i \in DOMAIN transfers[t].pages :
        IF transfers[t].kind = "backup"
          THEN transfers[t].pages[i][2] \notin Range(free1) /\ transfers[t].pages[i][3] \notin Range(free2)
          ELSE transfers[t].pages[i][2] \notin Range(free2) /\ transfers[t].pages[i][3] \notin Range(free1)

(* O4 (an action property): within an epoch an executed or cancelled      *)
(* batch stays so, and only a prepared batch executes.                     *)
O4 == [][epoch' = epoch =>
           \A b \in BIds : /\ batches[b].state \in {"executed", "cancelled"} => batches'[b].state = batches[b].state
                           /\ batches'[b].state = "executed" /\ batches[b].state # "executed" => batches[b].state = "prepared"]_vars

(* D1: every valid copy holds the version tag last written to its page.    *)
D1 == \A n \in Names : Exists(n) /\ versions[n] # 0 =>
        /\ state1[n] = "valid" => tags1[phys1[n]] = versions[n]
        /\ state2[n] = "valid" => tags2[phys2[n]] = versions[n]

(* D1 at the reads: compute of a batch that may execute reads, for every   *)
(* token of each row, the tag last written there.                          *)
D1_Reads == \A b \in BIds : (ENABLED ExecuteBatch(<<epoch, b>>)) =>
        \A i \in DOMAIN batches[b].slots : \A j \in 1 .. batches[b].ends[i] - 1 :
            LET n == pages[batches[b].slots[i]][j] IN versions[n] # 0 => tags1[phys1[n]] = versions[n]

(* Liveness: every started transfer completes (or is discarded by a        *)
(* restart); every prepared batch is eventually executed or cancelled.     *)
TransfersComplete == \A t \in TIds : t \in inflight ~> t \notin inflight
BatchesResolve == \A b \in BIds : batches[b].state = "prepared" ~> batches[b].state # "prepared"
=============================================================================
