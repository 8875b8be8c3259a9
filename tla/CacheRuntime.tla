--------------------------- MODULE CacheRuntime ---------------------------
(***************************************************************************)
(* The cacheruntime protocol at the boundary between control (scheduler,   *)
(* prefix tree) and the GPU cache runtime (KV pages, transfers, ordering). *)
(*                                                                         *)
(* Every boundary operation of spec/protocol.md is one action, named as    *)
(* the method of src/cacheruntime/model.py in CamelCase, with the same     *)
(* preconditions and effects.  An operation that would raise a typed error *)
(* is an action that is not enabled: the state does not change (H1 for    *)
(* stale handles, atomicity for every error).                              *)
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
    NSlots,         \* request slots (slot ids 0 .. NSlots-1)
    NL1,            \* physical device pages (L1)
    NL2,            \* physical host pages (L2); 0 means no host tier
    MaxRowTokens,   \* max_request_tokens (page_size is 1: tokens = pages)
    MaxNames,       \* model bound: page names issued per epoch
    MaxExtents,     \* model bound: extent generations issued per epoch
    MaxBatches,     \* model bound: batches prepared per epoch
    MaxTransfers,   \* model bound: transfers started per epoch
    MaxGen,         \* model bound: a slot's generation
    MaxEpoch,       \* model bound: restarts
    MaxRef          \* model bound: references to one extent

VARIABLES
    epoch,      \* the runtime's epoch; a restart bumps it
    gen,        \* gen[s]: slot s's current generation
    live,       \* live[s]: slot s holds an open request
    row,        \* row[s]: the page names slot s's ReqToToken row maps, in token order
    ntok,       \* ntok[s]: tokens computed in row s (Len(row[s]) are reserved)
    holders,    \* holders[n]: live rows and extents that map page name n (0: no such page)
    ver,        \* ver[n]: version tag last written to page n (0: never written)
    l1,         \* l1[n]: page n's device copy, "absent" | "filling" | "valid"
    p1,         \* p1[n]: the physical device page of that copy (-1 if none)
    l2,         \* l2[n]: page n's host copy, "absent" | "filling" | "valid"
    p2,         \* p2[n]: the physical host page of that copy (-1 if none)
    nextPage,   \* the next page name to issue in this epoch
    free1,      \* the device free list (a queue of physical pages)
    free2,      \* the host free list
    def1,       \* def1[p]: in-flight transfers a deferred free of device page p waits for
    def2,       \* def2[p]: the same for host page p
    c1,         \* c1[p]: the version tag device page p holds (memory survives frees)
    c2,         \* c2[p]: the version tag host page p holds
    ext,        \* ext[g]: extent g's reference count (0: not live) and page names
    nextExt,    \* the next extent generation to issue in this epoch
    batch,      \* batch[b]: state, items (slots in plan order), row lengths before/after
    nextBatch,  \* the next batch id in this epoch
    tr,         \* tr[t]: transfer t: kind, moves <<name, source, destination>>, waits
    inflight,   \* transfers started and not completed (H2D and D2H streams)
    nextT,      \* the next transfer id in this epoch
    unrep,      \* completed transfers not yet reported by a poll, in completion order
    nextTag     \* the next version tag; never resets, not even at a restart (D1)

vars == <<epoch, gen, live, row, ntok, holders, ver, l1, p1, l2, p2, nextPage,
          free1, free2, def1, def2, c1, c2, ext, nextExt, batch, nextBatch,
          tr, inflight, nextT, unrep, nextTag>>

-----------------------------------------------------------------------------
(* Sets, canonical values, helpers.                                        *)

Slots == 0 .. NSlots - 1
Names == 0 .. MaxNames - 1
Phys1 == 0 .. NL1 - 1
Phys2 == 0 .. NL2 - 1
EIds == 1 .. MaxExtents
BIds == 0 .. MaxBatches - 1
TIds == 0 .. MaxTransfers - 1
Copy == {"absent", "filling", "valid"}
Kinds == {"Backup", "Restore", "Demote", "Drop"}
NoExt == <<-1, 0>>                       \* "no extent" in a plan item or restore slot
NoExtent == [ref |-> 0, pages |-> <<>>]
NoBatch == [st |-> "none", items |-> <<>>, start |-> <<>>, end |-> <<>>]
NoTransfer == [kind |-> "none", moves |-> <<>>, waits |-> {}]

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
               /\ h[3] = gen[h[2]]
               /\ live[h[2]]
ValidExt(x) == /\ x[1] = epoch
               /\ x[2] \in EIds
               /\ ext[x[2]].ref > 0
ValidBatch(bh) == /\ bh[1] = epoch
                  /\ bh[2] \in BIds
                  /\ bh[2] < nextBatch

Exists(n) == holders[n] > 0
InPrepared(s) == \E b \in BIds : batch[b].st = "prepared" /\ s \in Range(batch[b].items)
RowHeld == UNION {Range(row[s]) : s \in {s2 \in Slots : live[s2]}}

(* Transfers that read or write physical page p of a tier.                 *)
Touch1(p) == {t \in inflight : \E i \in DOMAIN tr[t].moves :
                 \/ tr[t].kind = "backup" /\ tr[t].moves[i][2] = p
                 \/ tr[t].kind = "restore" /\ tr[t].moves[i][3] = p}
Touch2(p) == {t \in inflight : \E i \in DOMAIN tr[t].moves :
                 \/ tr[t].kind = "backup" /\ tr[t].moves[i][3] = p
                 \/ tr[t].kind = "restore" /\ tr[t].moves[i][2] = p}

(* Freeing physical pages ps (a sequence) of a tier: each goes to the end  *)
(* of the free list, or, while a transfer touches it, is deferred until    *)
(* that transfer completes (O3).                                           *)
Free1After(ps) == LET ok(p) == Touch1(p) = {} IN free1 \o SelectSeq(ps, ok)
Def1After(ps) == [p \in Phys1 |-> IF p \in Range(ps) /\ Touch1(p) # {} THEN Touch1(p) ELSE def1[p]]
Free2After(ps) == LET ok(p) == Touch2(p) = {} IN free2 \o SelectSeq(ps, ok)
Def2After(ps) == [p \in Phys2 |-> IF p \in Range(ps) /\ Touch2(p) # {} THEN Touch2(p) ELSE def2[p]]

(* Every page name of sequence S loses one holder; a page whose count     *)
(* reaches 0 ends: its copies are freed (or deferred), in the order the    *)
(* pages end.                                                              *)
Ending(S) == {n \in Range(S) : holders[n] = Count(S, n)}
EndSeq(S) == LET last(i) == S[i] \in Ending(S) /\ \A j \in DOMAIN S : j > i => S[j] # S[i]
                 idx == SelectSeq([i \in 1 .. Len(S) |-> i], last)
             IN [k \in 1 .. Len(idx) |-> S[idx[k]]]
PhysSeq1(ns) == LET has(n) == l1[n] # "absent" IN
                LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> p1[hs[i]]]
PhysSeq2(ns) == LET has(n) == l2[n] # "absent" IN
                LET hs == SelectSeq(ns, has) IN [i \in 1 .. Len(hs) |-> p2[hs[i]]]
DropHolders(S) ==
    LET E == Ending(S)
        es == EndSeq(S)
    IN /\ holders' = [n \in Names |-> holders[n] - Count(S, n)]
       /\ ver' = [n \in Names |-> IF n \in E THEN 0 ELSE ver[n]]
       /\ l1' = [n \in Names |-> IF n \in E THEN "absent" ELSE l1[n]]
       /\ p1' = [n \in Names |-> IF n \in E THEN -1 ELSE p1[n]]
       /\ l2' = [n \in Names |-> IF n \in E THEN "absent" ELSE l2[n]]
       /\ p2' = [n \in Names |-> IF n \in E THEN -1 ELSE p2[n]]
       /\ free1' = Free1After(PhysSeq1(es))
       /\ def1' = Def1After(PhysSeq1(es))
       /\ free2' = Free2After(PhysSeq2(es))
       /\ def2' = Def2After(PhysSeq2(es))

(* The pages of extent g a restore moves: those without a device copy.     *)
RestorePages(g) == LET none(n) == l1[n] = "absent" IN SelectSeq(ext[g].pages, none)
(* The pages of extent g a backup moves: those without a host copy.        *)
BackupPages(g) == LET none(n) == l2[n] = "absent" IN SelectSeq(ext[g].pages, none)

-----------------------------------------------------------------------------
TypeOK ==
    /\ epoch \in 0 .. MaxEpoch
    /\ gen \in [Slots -> 0 .. MaxGen]
    /\ live \in [Slots -> BOOLEAN]
    /\ \A s \in Slots : row[s] \in Seq(Names) /\ Len(row[s]) <= MaxRowTokens
    /\ ntok \in [Slots -> 0 .. MaxRowTokens]
    /\ holders \in [Names -> Nat] /\ ver \in [Names -> Nat]
    /\ l1 \in [Names -> Copy] /\ l2 \in [Names -> Copy]
    /\ p1 \in [Names -> Phys1 \cup {-1}] /\ p2 \in [Names -> Phys2 \cup {-1}]
    /\ nextPage \in 0 .. MaxNames
    /\ free1 \in Seq(Phys1) /\ free2 \in Seq(Phys2)
    /\ def1 \in [Phys1 -> SUBSET TIds] /\ def2 \in [Phys2 -> SUBSET TIds]
    /\ c1 \in [Phys1 -> Nat] /\ c2 \in [Phys2 -> Nat]
    /\ \A g \in EIds : ext[g].ref \in 0 .. MaxRef /\ ext[g].pages \in Seq(Names)
    /\ nextExt \in 1 .. MaxExtents + 1
    /\ \A b \in BIds : batch[b].st \in {"none", "prepared", "executed", "cancelled"}
    /\ nextBatch \in 0 .. MaxBatches
    /\ \A t \in TIds : tr[t].kind \in {"none", "backup", "restore"}
    /\ inflight \subseteq TIds
    /\ nextT \in 0 .. MaxTransfers
    /\ unrep \in Seq(TIds)
    /\ nextTag \in Nat \ {0}

Init ==
    /\ epoch = 0
    /\ gen = [s \in Slots |-> 0]
    /\ live = [s \in Slots |-> FALSE]
    /\ row = [s \in Slots |-> <<>>]
    /\ ntok = [s \in Slots |-> 0]
    /\ holders = [n \in Names |-> 0]
    /\ ver = [n \in Names |-> 0]
    /\ l1 = [n \in Names |-> "absent"]
    /\ p1 = [n \in Names |-> -1]
    /\ l2 = [n \in Names |-> "absent"]
    /\ p2 = [n \in Names |-> -1]
    /\ nextPage = 0
    /\ free1 = Seq0(NL1)
    /\ free2 = Seq0(NL2)
    /\ def1 = [p \in Phys1 |-> {}]
    /\ def2 = [p \in Phys2 |-> {}]
    /\ c1 = [p \in Phys1 |-> 0]
    /\ c2 = [p \in Phys2 |-> 0]
    /\ ext = [g \in EIds |-> NoExtent]
    /\ nextExt = 1
    /\ batch = [b \in BIds |-> NoBatch]
    /\ nextBatch = 0
    /\ tr = [t \in TIds |-> NoTransfer]
    /\ inflight = {}
    /\ nextT = 0
    /\ unrep = <<>>
    /\ nextTag = 1

-----------------------------------------------------------------------------
(* OpenRequest: the lowest-numbered slot that is not live becomes live     *)
(* with an empty row, at its current generation (OutOfSlots otherwise).   *)
OpenRequest ==
    /\ \E s \in Slots : ~live[s]
    /\ LET s == CHOOSE v \in Slots : ~live[v] /\ \A w \in Slots : ~live[w] => v <= w
       IN /\ live' = [live EXCEPT ![s] = TRUE]
          /\ row' = [row EXCEPT ![s] = <<>>]
          /\ ntok' = [ntok EXCEPT ![s] = 0]
    /\ UNCHANGED <<epoch, gen, holders, ver, l1, p1, l2, p2, nextPage, free1, free2,
                   def1, def2, c1, c2, ext, nextExt, batch, nextBatch, tr, inflight,
                   nextT, unrep, nextTag>>

(* CloseRequest: the slot stops being live and its generation grows at    *)
(* once (H2); every page its row maps loses a holder (RequestBusy while    *)
(* the request is in a prepared batch).                                    *)
CloseRequest(h) ==
    /\ ValidReq(h)
    /\ ~InPrepared(h[2])
    /\ gen[h[2]] < MaxGen                                  \* model bound
    /\ LET s == h[2] IN
       /\ live' = [live EXCEPT ![s] = FALSE]
       /\ gen' = [gen EXCEPT ![s] = @ + 1]
       /\ row' = [row EXCEPT ![s] = <<>>]
       /\ ntok' = [ntok EXCEPT ![s] = 0]
       /\ DropHolders(row[s])
    /\ UNCHANGED <<epoch, nextPage, c1, c2, ext, nextExt, batch, nextBatch, tr,
                   inflight, nextT, unrep, nextTag>>

(* PrepareBatch: validate a plan, start its restore, map attached extents  *)
(* to the front of their rows and allocate one new page per item; nothing *)
(* changes if any check fails (InvalidPlan, NotBackedUp, NotResident,     *)
(* RowFull, OutOfPages).  A plan is [items |-> <<<<req, ext or NoExt>>,   *)
(* ...>>, restore |-> ext or NoExt].                                       *)
PrepareBatch(P) ==
    LET its == P.items
        k == Len(its)
        slot(i) == its[i][1][2]
        att(i) == its[i][2]
        attPages(i) == IF att(i) = NoExt THEN <<>> ELSE ext[att(i)[2]].pages
        rx == P.restore
        rs == IF rx = NoExt THEN <<>> ELSE RestorePages(rx[2])
        r == Len(rs)
        end(i) == Len(row[slot(i)]) + Len(attPages(i)) + 1
        newName(i) == nextPage + i - 1
        newNames == {newName(i) : i \in 1 .. k}
        item(s) == CHOOSE i \in 1 .. k : slot(i) = s
        attached == Concat([i \in 1 .. k |-> attPages(i)])
        t == nextT
    IN
    \* handle checks and preconditions, in the model's order
    /\ k >= 1
    /\ \A i \in 1 .. k : ValidReq(its[i][1]) /\ (att(i) = NoExt \/ ValidExt(att(i)))
    /\ rx = NoExt \/ (ValidExt(rx) /\ NL2 > 0)
    /\ \A i, j \in 1 .. k : i # j => slot(i) # slot(j)
    /\ \A i \in 1 .. r : l2[rs[i]] # "absent"                           \* NotBackedUp
    /\ \A i \in 1 .. k : att(i) # NoExt => Len(row[slot(i)]) = 0        \* InvalidPlan
    /\ \A i \in 1 .. k : \A n \in Range(attPages(i)) :
          l1[n] # "absent" \/ n \in Range(rs)                           \* NotResident
    /\ \A i \in 1 .. k : end(i) <= MaxRowTokens                         \* RowFull
    /\ k + r <= Len(free1)                                              \* OutOfPages(L1)
    /\ nextBatch < MaxBatches /\ nextPage + k <= MaxNames               \* model bounds
    /\ rx # NoExt => nextT < MaxTransfers
    \* effects: the restore (H2D) starts on the first r free device pages
    /\ IF rx = NoExt
         THEN UNCHANGED <<tr, inflight, nextT, unrep>>
       ELSE IF r = 0
         THEN /\ nextT' = t + 1                       \* nothing to move: completes at once
              /\ unrep' = Append(unrep, t)
              /\ UNCHANGED <<tr, inflight>>
       ELSE /\ tr' = [tr EXCEPT ![t] =
                 [kind |-> "restore",
                  moves |-> [i \in 1 .. r |-> <<rs[i], p2[rs[i]], free1[i]>>],
                  waits |-> UNION {IF l2[rs[i]] = "filling" THEN Touch2(p2[rs[i]]) ELSE {} : i \in 1 .. r}]]
            /\ inflight' = inflight \cup {t}
            /\ nextT' = t + 1
            /\ UNCHANGED unrep
    \* attached pages gain a holder; new pages are named and placed after them
    /\ row' = [s \in Slots |-> IF \E i \in 1 .. k : slot(i) = s
                               THEN row[s] \o attPages(item(s)) \o <<newName(item(s))>>
                               ELSE row[s]]
    /\ holders' = [n \in Names |-> IF n \in newNames THEN 1 ELSE holders[n] + Count(attached, n)]
    /\ l1' = [n \in Names |-> IF n \in newNames THEN "valid"
                              ELSE IF n \in Range(rs) THEN "filling" ELSE l1[n]]
    /\ p1' = [n \in Names |-> IF n \in newNames THEN free1[r + n - nextPage + 1]
                              ELSE IF n \in Range(rs)
                                   THEN free1[CHOOSE i \in 1 .. r : rs[i] = n]
                                   ELSE p1[n]]
    /\ free1' = SubSeq(free1, r + k + 1, Len(free1))
    /\ nextPage' = nextPage + k
    /\ batch' = [batch EXCEPT ![nextBatch] =
                    [st |-> "prepared",
                     items |-> [i \in 1 .. k |-> slot(i)],
                     start |-> [i \in 1 .. k |-> Len(row[slot(i)])],
                     end |-> [i \in 1 .. k |-> end(i)]]]
    /\ nextBatch' = nextBatch + 1
    /\ UNCHANGED <<epoch, gen, live, ntok, ver, l2, p2, free2, def1, def2, c1, c2,
                   ext, nextExt, nextTag>>

(* ExecuteBatch: compute, once it may (KV_READY: no H2D into a page it     *)
(* reads is in flight, O1), writes each item's token with the next version *)
(* tag; the batch is executed and never runs again (O4).  Not enabled if   *)
(* executed (AlreadyExecuted), cancelled (NotPrepared) or if an earlier    *)
(* prepared batch shares a request (OutOfOrder).                           *)
ExecuteBatchOk(bh) ==
    /\ ValidBatch(bh)
    /\ batch[bh[2]].st = "prepared"
    /\ \A c \in BIds : c < bh[2] /\ batch[c].st = "prepared"
          => Range(batch[c].items) \cap Range(batch[bh[2]].items) = {}
KVReady(bh) ==
    LET B == batch[bh[2]]
        reads == UNION {{row[B.items[i]][j] : j \in 1 .. B.end[i]} : i \in DOMAIN B.items}
    IN \A t \in inflight : tr[t].kind = "restore" =>
          \A i \in DOMAIN tr[t].moves : tr[t].moves[i][1] \notin reads
ExecuteBatch(bh) ==
    LET b == bh[2]
        B == batch[b]
        k == Len(B.items)
        written(i) == row[B.items[i]][B.end[i]]
        wrote == {written(i) : i \in 1 .. k}
        idx(n) == CHOOSE i \in 1 .. k : written(i) = n
        physIdx(p) == CHOOSE i \in 1 .. k : p1[written(i)] = p
    IN
    /\ ExecuteBatchOk(bh)
    /\ KVReady(bh)
    /\ ver' = [n \in Names |-> IF n \in wrote THEN nextTag + idx(n) - 1 ELSE ver[n]]
    /\ c1' = [p \in Phys1 |-> IF \E i \in 1 .. k : p1[written(i)] = p
                              THEN nextTag + physIdx(p) - 1 ELSE c1[p]]
    /\ ntok' = [s \in Slots |-> IF s \in Range(B.items)
                                THEN B.end[CHOOSE i \in 1 .. k : B.items[i] = s]
                                ELSE ntok[s]]
    /\ batch' = [batch EXCEPT ![b].st = "executed"]
    /\ nextTag' = nextTag + k
    /\ UNCHANGED <<epoch, gen, live, row, holders, l1, p1, l2, p2, nextPage, free1,
                   free2, def1, def2, c2, ext, nextExt, nextBatch, tr, inflight,
                   nextT, unrep>>

(* CancelBatch: the batch's new and attached pages lose their holder and   *)
(* rows return to their previous length; restores it started go on.  Not  *)
(* enabled if executed, cancelled, or a later prepared batch shares a      *)
(* request (BatchDependency).                                              *)
CancelBatch(bh) ==
    LET b == bh[2]
        B == batch[b]
        k == Len(B.items)
        dropped == Concat([i \in 1 .. k |-> SubSeq(row[B.items[i]], B.start[i] + 1, Len(row[B.items[i]]))])
    IN
    /\ ValidBatch(bh)
    /\ B.st = "prepared"
    /\ \A c \in BIds : c > b /\ batch[c].st = "prepared" => Range(batch[c].items) \cap Range(B.items) = {}
    /\ row' = [s \in Slots |-> IF s \in Range(B.items)
                               THEN SubSeq(row[s], 1, B.start[CHOOSE i \in 1 .. k : B.items[i] = s])
                               ELSE row[s]]
    /\ DropHolders(dropped)
    /\ batch' = [batch EXCEPT ![b].st = "cancelled"]
    /\ UNCHANGED <<epoch, gen, live, ntok, nextPage, c1, c2, ext, nextExt, nextBatch,
                   tr, inflight, nextT, unrep, nextTag>>

(* Publish: full computed pages first..first+count-1 of a row become a new *)
(* extent with one reference; each page gains a holder (InvalidPageRun).   *)
Publish(h, first, count) ==
    LET s == h[2]
        ps == SubSeq(row[s], first + 1, first + count)
    IN
    /\ ValidReq(h)
    /\ count >= 1 /\ first >= 0 /\ first + count <= ntok[s]
    /\ nextExt <= MaxExtents                                            \* model bound
    /\ holders' = [n \in Names |-> holders[n] + Count(ps, n)]
    /\ ext' = [ext EXCEPT ![nextExt] = [ref |-> 1, pages |-> ps]]
    /\ nextExt' = nextExt + 1
    /\ UNCHANGED <<epoch, gen, live, row, ntok, ver, l1, p1, l2, p2, nextPage, free1,
                   free2, def1, def2, c1, c2, batch, nextBatch, tr, inflight, nextT,
                   unrep, nextTag>>

(* Split: an extent with one reference is retired and two new extents     *)
(* cover its first `at` pages and the rest; holders do not change          *)
(* (ExtentShared, InvalidPageRun).                                         *)
Split(x, at) ==
    LET g == x[2]
        ps == ext[g].pages
    IN
    /\ ValidExt(x)
    /\ ext[g].ref = 1
    /\ 0 < at /\ at < Len(ps)
    /\ nextExt + 1 <= MaxExtents                                        \* model bound
    /\ ext' = [ext EXCEPT ![g] = NoExtent,
                          ![nextExt] = [ref |-> 1, pages |-> SubSeq(ps, 1, at)],
                          ![nextExt + 1] = [ref |-> 1, pages |-> SubSeq(ps, at + 1, Len(ps))]]
    /\ nextExt' = nextExt + 2
    /\ UNCHANGED <<epoch, gen, live, row, ntok, holders, ver, l1, p1, l2, p2, nextPage,
                   free1, free2, def1, def2, c1, c2, batch, nextBatch, tr, inflight,
                   nextT, unrep, nextTag>>

(* Retain: a live extent gains a reference.                                *)
Retain(x) ==
    /\ ValidExt(x)
    /\ ext[x[2]].ref < MaxRef                                           \* model bound
    /\ ext' = [ext EXCEPT ![x[2]].ref = @ + 1]
    /\ UNCHANGED <<epoch, gen, live, row, ntok, holders, ver, l1, p1, l2, p2, nextPage,
                   free1, free2, def1, def2, c1, c2, nextExt, batch, nextBatch, tr,
                   inflight, nextT, unrep, nextTag>>

(* Release: a live extent loses a reference; with the last one it ends and *)
(* each of its pages loses a holder (a released ref is stale: R4).         *)
Release(x) ==
    LET g == x[2] IN
    /\ ValidExt(x)
    /\ IF ext[g].ref = 1
         THEN /\ ext' = [ext EXCEPT ![g] = NoExtent]
              /\ DropHolders(ext[g].pages)
         ELSE /\ ext' = [ext EXCEPT ![g].ref = @ - 1]
              /\ UNCHANGED <<holders, ver, l1, p1, l2, p2, free1, free2, def1, def2>>
    /\ UNCHANGED <<epoch, gen, live, row, ntok, nextPage, c1, c2, nextExt, batch,
                   nextBatch, tr, inflight, nextT, unrep, nextTag>>

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
    /\ nextT < MaxTransfers                                             \* model bound
    /\ nextT' = nextT + 1
    /\ IF ms = <<>>
         THEN /\ unrep' = Append(unrep, nextT)            \* nothing to move: completes at once
              /\ UNCHANGED <<tr, inflight>>
         ELSE /\ tr' = [tr EXCEPT ![nextT] = [kind |-> kind, moves |-> ms, waits |-> ws]]
              /\ inflight' = inflight \cup {nextT}
              /\ UNCHANGED unrep

Submit(kind, x) ==
    LET g == x[2]
        ps == ext[g].pages
        bs == BackupPages(g)
        rs == RestorePages(g)
    IN
    /\ ValidExt(x)
    /\ NL2 > 0
    /\ CASE kind = "Backup" ->
              /\ Len(bs) <= Len(free2)                                  \* OutOfPages(L2)
              /\ StartTransfer("backup",
                    [i \in 1 .. Len(bs) |-> <<bs[i], p1[bs[i]], free2[i]>>],
                    UNION {IF l1[bs[i]] = "filling" THEN Touch1(p1[bs[i]]) ELSE {} : i \in 1 .. Len(bs)})
              /\ l2' = [n \in Names |-> IF n \in Range(bs) THEN "filling" ELSE l2[n]]
              /\ p2' = [n \in Names |-> IF n \in Range(bs)
                                        THEN free2[CHOOSE i \in 1 .. Len(bs) : bs[i] = n]
                                        ELSE p2[n]]
              /\ free2' = SubSeq(free2, Len(bs) + 1, Len(free2))
              /\ UNCHANGED <<l1, p1, free1, def1, def2>>
         [] kind = "Restore" ->
              /\ \A n \in Range(rs) : l2[n] # "absent"                  \* NotBackedUp
              /\ Len(rs) <= Len(free1)                                  \* OutOfPages(L1)
              /\ StartTransfer("restore",
                    [i \in 1 .. Len(rs) |-> <<rs[i], p2[rs[i]], free1[i]>>],
                    UNION {IF l2[rs[i]] = "filling" THEN Touch2(p2[rs[i]]) ELSE {} : i \in 1 .. Len(rs)})
              /\ l1' = [n \in Names |-> IF n \in Range(rs) THEN "filling" ELSE l1[n]]
              /\ p1' = [n \in Names |-> IF n \in Range(rs)
                                        THEN free1[CHOOSE i \in 1 .. Len(rs) : rs[i] = n]
                                        ELSE p1[n]]
              /\ free1' = SubSeq(free1, Len(rs) + 1, Len(free1))
              /\ UNCHANGED <<l2, p2, free2, def1, def2>>
         [] kind = "Demote" ->
              /\ \A n \in Range(ps) : l2[n] # "absent"                  \* NotBackedUp
              /\ Range(ps) \cap RowHeld = {}                            \* ExtentInUse
              /\ l1' = [n \in Names |-> IF n \in Range(ps) THEN "absent" ELSE l1[n]]
              /\ p1' = [n \in Names |-> IF n \in Range(ps) THEN -1 ELSE p1[n]]
              /\ free1' = Free1After(PhysSeq1(ps))
              /\ def1' = Def1After(PhysSeq1(ps))
              /\ UNCHANGED <<l2, p2, free2, def2, tr, inflight, nextT, unrep>>
         [] kind = "Drop" ->
              /\ \A n \in Range(ps) : l1[n] # "absent"                  \* WouldLoseData
              /\ l2' = [n \in Names |-> IF n \in Range(ps) THEN "absent" ELSE l2[n]]
              /\ p2' = [n \in Names |-> IF n \in Range(ps) THEN -1 ELSE p2[n]]
              /\ free2' = Free2After(PhysSeq2(ps))
              /\ def2' = Def2After(PhysSeq2(ps))
              /\ UNCHANGED <<l1, p1, free1, def1, tr, inflight, nextT, unrep>>
    /\ UNCHANGED <<epoch, gen, live, row, ntok, holders, ver, nextPage, c1, c2, ext,
                   nextExt, batch, nextBatch, nextTag>>

(* PollCompletions: the completions not yet reported are reported, once.   *)
PollCompletions ==
    /\ unrep' = <<>>
    /\ UNCHANGED <<epoch, gen, live, row, ntok, holders, ver, l1, p1, l2, p2, nextPage,
                   free1, free2, def1, def2, c1, c2, ext, nextExt, batch, nextBatch, tr,
                   inflight, nextT, nextTag>>

(* WaitCompletions: blocks until no transfer is in flight (the environment *)
(* completes them), then reports as PollCompletions does.                  *)
WaitCompletions ==
    /\ inflight = {}
    /\ PollCompletions

(* Restart: drains the transfers in flight (enabled once the environment  *)
(* has completed them: their copies land), then everything is forgotten;   *)
(* live slots' generations and the epoch grow, so every handle is stale   *)
(* (scenario 5); version tags and memory contents carry on (D1).           *)
Restart ==
    /\ inflight = {}
    /\ epoch < MaxEpoch /\ \A s \in Slots : live[s] => gen[s] < MaxGen  \* model bounds
    /\ epoch' = epoch + 1
    /\ gen' = [s \in Slots |-> IF live[s] THEN gen[s] + 1 ELSE gen[s]]
    /\ live' = [s \in Slots |-> FALSE]
    /\ row' = [s \in Slots |-> <<>>]
    /\ ntok' = [s \in Slots |-> 0]
    /\ holders' = [n \in Names |-> 0]
    /\ ver' = [n \in Names |-> 0]
    /\ l1' = [n \in Names |-> "absent"]
    /\ p1' = [n \in Names |-> -1]
    /\ l2' = [n \in Names |-> "absent"]
    /\ p2' = [n \in Names |-> -1]
    /\ nextPage' = 0
    /\ free1' = Seq0(NL1)
    /\ free2' = Seq0(NL2)
    /\ def1' = [p \in Phys1 |-> {}]
    /\ def2' = [p \in Phys2 |-> {}]
    /\ ext' = [g \in EIds |-> NoExtent]
    /\ nextExt' = 1
    /\ batch' = [b \in BIds |-> NoBatch]
    /\ nextBatch' = 0
    /\ tr' = [t \in TIds |-> NoTransfer]
    /\ inflight' = {}
    /\ nextT' = 0
    /\ unrep' = <<>>
    /\ UNCHANGED <<c1, c2, nextTag>>

(* CompleteTransfer (environment): a transfer whose predecessors have      *)
(* completed lands: its destinations receive the sources' tags, copies it  *)
(* filled become valid, and deferred frees that waited only on it run.     *)
CompleteTransfer(t) ==
    LET ms == tr[t].moves
        bk == tr[t].kind = "backup"
        dsts == {ms[i][3] : i \in DOMAIN ms}
        srcOf(d) == ms[CHOOSE i \in DOMAIN ms : ms[i][3] = d][2]
        filled(n, p) == \E i \in DOMAIN ms : ms[i][1] = n /\ ms[i][3] = p
        rel1 == {p \in Phys1 : def1[p] = {t}}
        rel2 == {p \in Phys2 : def2[p] = {t}}
    IN
    /\ t \in inflight
    /\ tr[t].waits \cap inflight = {}
    /\ IF bk
         THEN /\ c2' = [p \in Phys2 |-> IF p \in dsts THEN c1[srcOf(p)] ELSE c2[p]]
              /\ l2' = [n \in Names |-> IF Exists(n) /\ l2[n] # "absent" /\ filled(n, p2[n])
                                        THEN "valid" ELSE l2[n]]
              /\ UNCHANGED <<c1, l1>>
         ELSE /\ c1' = [p \in Phys1 |-> IF p \in dsts THEN c2[srcOf(p)] ELSE c1[p]]
              /\ l1' = [n \in Names |-> IF Exists(n) /\ l1[n] # "absent" /\ filled(n, p1[n])
                                        THEN "valid" ELSE l1[n]]
              /\ UNCHANGED <<c2, l2>>
    /\ def1' = [p \in Phys1 |-> def1[p] \ {t}]
    /\ def2' = [p \in Phys2 |-> def2[p] \ {t}]
    /\ free1' = free1 \o SortedSeq(rel1)
    /\ free2' = free2 \o SortedSeq(rel2)
    /\ inflight' = inflight \ {t}
    /\ tr' = [tr EXCEPT ![t] = NoTransfer]
    /\ unrep' = Append(unrep, t)
    /\ UNCHANGED <<epoch, gen, live, row, ntok, holders, ver, p1, p2, nextPage, ext,
                   nextExt, batch, nextBatch, nextT, nextTag>>

-----------------------------------------------------------------------------
(* The next-state relation: control calls every operation with current     *)
(* handles (a stale handle enables nothing: H1 below checks it), the       *)
(* environment completes transfers.                                        *)

ReqH(s) == <<epoch, s, gen[s]>>
ExtH(g) == <<epoch, g>>
LiveExts == {g \in EIds : ext[g].ref > 0}
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
    \/ \E s \in Slots, f \in 0 .. MaxRowTokens - 1, c \in 1 .. MaxRowTokens : Publish(ReqH(s), f, c)
    \/ \E g \in LiveExts :
          \/ Retain(ExtH(g))
          \/ Release(ExtH(g))
          \/ \E at \in 1 .. MaxRowTokens : Split(ExtH(g), at)
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
Read1 == {p1[n] : n \in {m \in Names : l1[m] = "valid"}}
         \cup UNION {{tr[t].moves[i][2] : i \in DOMAIN tr[t].moves} : t \in {u \in inflight : tr[u].kind = "backup"}}
Read2 == {p2[n] : n \in {m \in Names : l2[m] = "valid"}}
         \cup UNION {{tr[t].moves[i][2] : i \in DOMAIN tr[t].moves} : t \in {u \in inflight : tr[u].kind = "restore"}}
View == <<epoch, gen, live, row, ntok, holders, ver, l1, p1, l2, p2, nextPage, free1, free2,
          def1, def2, [p \in Phys1 |-> IF p \in Read1 THEN c1[p] ELSE 0],
          [p \in Phys2 |-> IF p \in Read2 THEN c2[p] ELSE 0], ext, nextExt, batch, nextBatch,
          tr, inflight, nextT, unrep, nextTag>>

(* Liveness: the environment completes every transfer it can and control   *)
(* executes every batch it can.                                            *)
Fairness ==
    /\ \A t \in TIds : WF_vars(CompleteTransfer(t))
    /\ \A b \in BIds : WF_vars(ExecuteBatch(<<epoch, b>>))
LiveSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Invariants, named by catalogue id (spec/invariants.md).                 *)

ReqHandles == (0 .. MaxEpoch) \X Slots \X (0 .. MaxGen)
StaleReq(h) == h[1] < epoch \/ (h[1] = epoch /\ h[3] < gen[h[2]])
StaleExt(x) == x[1] < epoch \/ (x[1] = epoch /\ x[2] < nextExt /\ ext[x[2]].ref = 0)
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
H2 == [][\A s \in Slots : /\ gen'[s] >= gen[s]
                          /\ (live[s] /\ ~live'[s]) => gen'[s] > gen[s]]_vars

(* H3: at most one request handle per slot is current.                     *)
H3 == \A s \in Slots : Cardinality({h \in ReqHandles : h[2] = s /\ ValidReq(h)}) <= 1

Mapped1 == {p1[n] : n \in {m \in Names : l1[m] # "absent"}}
Mapped2 == {p2[n] : n \in {m \in Names : l2[m] # "absent"}}
Deferred1 == {p \in Phys1 : def1[p] # {}}
Deferred2 == {p \in Phys2 : def2[p] # {}}
CopiesOf1(p) == Cardinality({n \in Names : l1[n] # "absent" /\ p1[n] = p})
CopiesOf2(p) == Cardinality({n \in Names : l2[n] # "absent" /\ p2[n] = p})

(* R1: every physical page is exactly one of free, mapped to one page      *)
(* name's copy, or deferred; free + held = total, in both pools.           *)
R1 == /\ \A p \in Phys1 : Count(free1, p) + CopiesOf1(p) + (IF p \in Deferred1 THEN 1 ELSE 0) = 1
      /\ \A p \in Phys2 : Count(free2, p) + CopiesOf2(p) + (IF p \in Deferred2 THEN 1 ELSE 0) = 1

Held(n) == (\E s \in Slots : live[s] /\ n \in Range(row[s])) \/ (\E g \in EIds : n \in Range(ext[g].pages))

(* R2: no physical page of a page name held by a live row or extent is on  *)
(* a free list; every held page name exists.                               *)
R2 == \A n \in Names : Held(n) =>
        /\ Exists(n)
        /\ l1[n] # "absent" => p1[n] \notin Range(free1)
        /\ l2[n] # "absent" => p2[n] \notin Range(free2)

(* R3: a page's holder count equals its live rows and extents.             *)
HolderCount(n) == (LET ls == {s \in Slots : live[s]} IN
                     Cardinality({<<s, i>> \in ls \X (1 .. MaxRowTokens) : i <= Len(row[s]) /\ row[s][i] = n}))
                  + Cardinality({<<g, i>> \in EIds \X (1 .. MaxRowTokens) :
                                   ext[g].ref > 0 /\ i <= Len(ext[g].pages) /\ ext[g].pages[i] = n})
R3 == \A n \in Names : holders[n] = HolderCount(n)

(* R4: no physical page is free twice, or free while mapped or deferred.   *)
R4 == /\ \A p \in Phys1 : Count(free1, p) <= 1
      /\ \A p \in Phys2 : Count(free2, p) <= 1
      /\ Range(free1) \cap (Mapped1 \cup Deferred1) = {}
      /\ Range(free2) \cap (Mapped2 \cup Deferred2) = {}

(* O1: every page a live row has computed over has a valid device copy:    *)
(* compute waited for KV_READY.                                            *)
O1 == \A s \in Slots : live[s] => \A i \in 1 .. ntok[s] : i <= Len(row[s]) => l1[row[s][i]] = "valid"

(* O2: an in-flight D2H moves only pages that completed compute wrote.     *)
O2 == \A t \in inflight : tr[t].kind = "backup" =>
        \A i \in DOMAIN tr[t].moves : Exists(tr[t].moves[i][1]) => ver[tr[t].moves[i][1]] # 0

(* O3: no physical page an in-flight transfer reads or writes is free.     *)
O3 == \A t \in inflight : \A i \in DOMAIN tr[t].moves :
        IF tr[t].kind = "backup"
          THEN tr[t].moves[i][2] \notin Range(free1) /\ tr[t].moves[i][3] \notin Range(free2)
          ELSE tr[t].moves[i][2] \notin Range(free2) /\ tr[t].moves[i][3] \notin Range(free1)

(* O4 (an action property): within an epoch an executed or cancelled      *)
(* batch stays so, and only a prepared batch executes.                     *)
O4 == [][epoch' = epoch =>
           \A b \in BIds : /\ batch[b].st \in {"executed", "cancelled"} => batch'[b].st = batch[b].st
                           /\ batch'[b].st = "executed" /\ batch[b].st # "executed" => batch[b].st = "prepared"]_vars

(* D1: every valid copy holds the version tag last written to its page.    *)
D1 == \A n \in Names : Exists(n) /\ ver[n] # 0 =>
        /\ l1[n] = "valid" => c1[p1[n]] = ver[n]
        /\ l2[n] = "valid" => c2[p2[n]] = ver[n]

(* D1 at the reads: compute of a batch that may execute reads, for every   *)
(* token of each row, the tag last written there.                          *)
D1_Reads == \A b \in BIds : (ENABLED ExecuteBatch(<<epoch, b>>)) =>
        \A i \in DOMAIN batch[b].items : \A j \in 1 .. batch[b].end[i] - 1 :
            LET n == row[batch[b].items[i]][j] IN ver[n] # 0 => c1[p1[n]] = ver[n]

(* Liveness: every started transfer completes (or is discarded by a        *)
(* restart); every prepared batch is eventually executed or cancelled.     *)
TransfersComplete == \A t \in TIds : t \in inflight ~> t \notin inflight
BatchesResolve == \A b \in BIds : batch[b].st = "prepared" ~> batch[b].st # "prepared"
=============================================================================
