--------------------------- MODULE CacheRuntimeL3 ---------------------------
(***************************************************************************)
(* The L3 tier of the cacheruntime protocol (spec/protocol.md section 9):  *)
(* page objects in a store keyed by control, persisted from a page and     *)
(* fetched into a batch's row through pinned host staging, in both host    *)
(* modes: resident (host pages are a cache tier, L2, and a persist reads a *)
(* host copy) and buffer_only (host pages are staging only).               *)
(*                                                                         *)
(* A module of its own beside CacheRuntime.tla, so that the pinned models  *)
(* of that module and its spec mutants stay as they are; it keeps that     *)
(* module's names (spec/glossary.md) for what the two share and leaves out *)
(* what section 9 does not touch, with these abstractions:                 *)
(*  - page_size = 1, and a page's content is its version tag, so control's *)
(*    key for a page (a hash of the token prefix up to it) is that tag:    *)
(*    Persist(n) names the key versions[n], and a key k names the bytes k.  *)
(*    Keys are 1 .. MaxVersion;                                            *)
(*  - requests, extents and batches are abstracted to page names: Write is *)
(*    compute writing a page (a row's page, published), Release ends a     *)
(*    name (the last holder goes: a release, a close, or the cancel of the  *)
(*    batch a fetch fills), and Execute is the compute of the batch a      *)
(*    fetched page was mapped for: it waits for the fetch (KV_READY, O1)   *)
(*    and fails, ending the page, if the fetch failed (ComputeFailed: the  *)
(*    batch is prepared again without the fetch, recomputing);             *)
(*  - a Backup lands in one step (its D2H is CacheRuntime.tla's);          *)
(*  - a transfer moves one page (a batch of pages is a transfer per page   *)
(*    here); persist and fetch have two phases each, as the runtime runs   *)
(*    them: a persist that stages (buffer_only) copies the device page     *)
(*    into a staging host page (StagePersist: the D2H) and then the store  *)
(*    reads staging (CompletePersist: the write); a fetch reads the object *)
(*    into staging (GetFetch: the store read, where a missing object is a  *)
(*    MISS) and then copies staging to the device page (CompleteFetch:     *)
(*    the H2D);                                                            *)
(*  - the store is the environment's: RemoveObject drops any object at any *)
(*    time (l3_exists is a hint), FailTransfer fails a store operation or  *)
(*    its staging copy at any phase (Faults);                              *)
(*  - free lists are sets (which free page a copy takes is the runtime's   *)
(*    choice, section 2.1); l3_exists changes nothing and is not an action.*)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    MaxNames,           \* model bound: page names issued (names 0 .. MaxNames-1)
    L1Pages,            \* physical device pages
    L2Pages,            \* physical host pages (a tier in resident mode, staging in buffer_only)
    MaxVersion,         \* model bound: version tags written, so keys are 1 .. MaxVersion
    MaxTransfers,       \* model bound: transfers started
    HostMode,           \* "resident" or "buffer_only"
    Faults              \* whether the environment's FailTransfer is enabled

\* Page names: who holds each, what was last written to it, the next name and tag.
VARIABLES
    holders,        \* holders[n]: 1 while page name n lives (a row or an extent holds it), else 0
    versions,       \* versions[n]: the version tag last written to page n (0: never written)
    nextPage,       \* the next page name to issue
    nextVersion     \* the next version tag
pageVars == <<holders, versions, nextPage, nextVersion>>

\* Copies: each page name's copy per tier and the physical page it occupies.
VARIABLES
    state1,         \* state1[n]: page n's device copy, "absent" | "filling" | "valid"
    phys1,          \* phys1[n]: its physical device page (-1 if none)
    state2,         \* state2[n]: page n's host copy (resident mode only), "absent" | "valid"
    phys2           \* phys2[n]: its physical host page (-1 if none)
copyVars == <<state1, phys1, state2, phys2>>

\* Pools: free pages per tier, frees deferred behind transfers, the tags memory holds.
VARIABLES
    free1,          \* the free device pages
    free2,          \* the free host pages
    deferred1,      \* deferred1[p]: in-flight transfers a deferred free of device page p waits for
    deferred2,      \* deferred2[p]: the same for host page p
    tags1,          \* tags1[p]: the version tag device page p holds
    tags2           \* tags2[p]: the version tag host page p holds
poolVars == <<free1, free2, deferred1, deferred2, tags1, tags2>>

\* L3: the store's objects, control's key per page name, and the pages a fetch filled for a batch.
VARIABLES
    objects,        \* objects[k]: the tag the object under key k holds (0: no object)
    keys,           \* keys[n]: the key control gave page n in a Persist or Fetch (0: none)
    fetched         \* fetched[n]: page n was mapped by a Fetch for a batch that has not executed
storeVars == <<objects, keys, fetched>>

\* Transfers: those in flight, the next id, completions not yet reported.
VARIABLES
    transfers,      \* transfers[t]: kind, phase, the page name, its key, src, staging, dst
    inflight,       \* transfers started and not completed
    nextTransfer,   \* the next transfer id
    unreported      \* completions not yet reported: [transferId, failure]
transferVars == <<transfers, inflight, nextTransfer, unreported>>

vars == <<pageVars, copyVars, poolVars, storeVars, transferVars>>

-----------------------------------------------------------------------------
(* Sets, records and canonical values.                                     *)

Names == 0 .. MaxNames - 1
Phys1 == 0 .. L1Pages - 1
Phys2 == 0 .. L2Pages - 1
Keys == 1 .. MaxVersion
TIds == 0 .. MaxTransfers - 1
Readable == {"valid"}                 \* no copy is dropping in this module
TransferFailures == {"none", "store", "miss"}
(* An L3 transfer: a persist reads src (a host copy, resident, or a       *)
(* device page through staging, buffer_only); a fetch writes staging and  *)
(* then dst.  staging and dst are -1 where there is none.                  *)
L3Transfers == [kind : {"persist", "fetch"}, phase : {"stage", "put", "get", "h2d"},
                name : Names, key : Keys, src : Phys1 \cup Phys2 \cup {-1},
                staging : Phys2 \cup {-1}, dst : Phys1 \cup {-1}]
NoTransfer == [kind |-> "persist", phase |-> "put", name |-> 0, key |-> 1, src |-> -1, staging |-> -1, dst |-> -1]
Min(S) == CHOOSE p \in S : \A q \in S : p <= q

Live(n) == holders[n] > 0
(* The physical pages an in-flight transfer reads or writes, per tier.     *)
Touches1(t) == LET tr == transfers[t] IN
               IF tr.kind = "fetch" THEN {tr.dst}
               ELSE IF tr.staging # -1 /\ tr.phase = "stage" THEN {tr.src} ELSE {}
Touches2(t) == LET tr == transfers[t] IN
               (IF tr.staging # -1 THEN {tr.staging} ELSE {})
               \cup (IF tr.kind = "persist" /\ tr.staging = -1 THEN {tr.src} ELSE {})
Staging == {transfers[t].staging : t \in {u \in inflight : transfers[u].staging # -1}}

(* A copy's physical page goes back to its free set, or waits for the     *)
(* in-flight transfers that touch it (O3), other than `done` (finishing). *)
Blocking1(p, done) == {t \in inflight \ done : p \in Touches1(t)}
Blocking2(p, done) == {t \in inflight \ done : p \in Touches2(t)}
(* The deferred frees that waited only for transfer t run.                 *)
RunDeferred(d, t) == [p \in DOMAIN d |-> d[p] \ {t}]
Ready(d, t) == {p \in DOMAIN d : d[p] # {} /\ d[p] \ {t} = {}}

TypeOK ==
    /\ holders \in [Names -> {0, 1}]
    /\ versions \in [Names -> 0 .. MaxVersion]
    /\ nextPage \in 0 .. MaxNames /\ nextVersion \in 1 .. MaxVersion + 1
    /\ state1 \in [Names -> {"absent", "filling", "valid"}] /\ phys1 \in [Names -> Phys1 \cup {-1}]
    /\ state2 \in [Names -> {"absent", "valid"}] /\ phys2 \in [Names -> Phys2 \cup {-1}]
    /\ free1 \subseteq Phys1 /\ free2 \subseteq Phys2
    /\ deferred1 \in [Phys1 -> SUBSET TIds] /\ deferred2 \in [Phys2 -> SUBSET TIds]
    /\ tags1 \in [Phys1 -> 0 .. MaxVersion] /\ tags2 \in [Phys2 -> 0 .. MaxVersion]
    /\ objects \in [Keys -> 0 .. MaxVersion] /\ keys \in [Names -> 0 .. MaxVersion]
    /\ fetched \in [Names -> BOOLEAN]
    /\ transfers \in [TIds -> L3Transfers] /\ inflight \subseteq TIds
    /\ nextTransfer \in 0 .. MaxTransfers
    /\ unreported \in Seq([transferId : TIds, failure : TransferFailures])

Init ==
    /\ holders = [n \in Names |-> 0] /\ versions = [n \in Names |-> 0]
    /\ nextPage = 0 /\ nextVersion = 1
    /\ state1 = [n \in Names |-> "absent"] /\ phys1 = [n \in Names |-> -1]
    /\ state2 = [n \in Names |-> "absent"] /\ phys2 = [n \in Names |-> -1]
    /\ free1 = Phys1 /\ free2 = Phys2
    /\ deferred1 = [p \in Phys1 |-> {}] /\ deferred2 = [p \in Phys2 |-> {}]
    /\ tags1 = [p \in Phys1 |-> 0] /\ tags2 = [p \in Phys2 |-> 0]
    /\ objects = [k \in Keys |-> 0] /\ keys = [n \in Names |-> 0] /\ fetched = [n \in Names |-> FALSE]
    /\ transfers = [t \in TIds |-> NoTransfer] /\ inflight = {} /\ nextTransfer = 0 /\ unreported = <<>>

-----------------------------------------------------------------------------
(* Control's operations and compute.                                      *)

(* Compute writes a new page: a fresh name with a valid device copy that  *)
(* holds a new version tag (a row's page, published as an extent).        *)
Write ==
    /\ nextPage \in Names /\ nextVersion <= MaxVersion /\ free1 # {}
    /\ LET n == nextPage
           p == Min(free1)
       IN /\ holders' = [holders EXCEPT ![n] = 1]
          /\ versions' = [versions EXCEPT ![n] = nextVersion]
          /\ nextPage' = nextPage + 1 /\ nextVersion' = nextVersion + 1
          /\ state1' = [state1 EXCEPT ![n] = "valid"] /\ phys1' = [phys1 EXCEPT ![n] = p]
          /\ free1' = free1 \ {p} /\ tags1' = [tags1 EXCEPT ![p] = nextVersion]
          /\ UNCHANGED <<state2, phys2, free2, deferred1, deferred2, tags2, storeVars, transferVars>>

(* A Backup gives a page a host copy (resident mode only: in buffer_only   *)
(* it is NoL2); here it lands in one step.                                 *)
Backup(n) ==
    /\ HostMode = "resident"
    /\ Live(n) /\ ~fetched[n] /\ state1[n] = "valid" /\ state2[n] = "absent" /\ free2 # {}
    /\ LET p == Min(free2)
       IN /\ state2' = [state2 EXCEPT ![n] = "valid"] /\ phys2' = [phys2 EXCEPT ![n] = p]
          /\ free2' = free2 \ {p} /\ tags2' = [tags2 EXCEPT ![p] = tags1[phys1[n]]]
          /\ UNCHANGED <<pageVars, state1, phys1, free1, deferred1, deferred2, tags1, storeVars, transferVars>>

(* A Persist writes a page to L3 under control's key for it: from its host *)
(* copy (resident: NotBackedUp without one), or from its device copy       *)
(* through a staging host page (buffer_only: OutOfPages(L2) without one).  *)
(* It only reads: no copy changes.                                         *)
Persist(n) ==
    /\ Live(n) /\ ~fetched[n] /\ nextTransfer \in TIds
    /\ IF HostMode = "resident" THEN state2[n] \in Readable ELSE state1[n] \in Readable /\ free2 # {}
    /\ LET t == nextTransfer
           staged == HostMode = "buffer_only"
           s == IF staged THEN Min(free2) ELSE -1
       IN /\ transfers' = [transfers EXCEPT ![t] = [kind |-> "persist", phase |-> IF staged THEN "stage" ELSE "put",
                                                    name |-> n, key |-> versions[n],
                                                    src |-> IF staged THEN phys1[n] ELSE phys2[n],
                                                    staging |-> s, dst |-> -1]]
          /\ free2' = IF staged THEN free2 \ {s} ELSE free2
          /\ keys' = [keys EXCEPT ![n] = versions[n]]
          /\ inflight' = inflight \cup {t} /\ nextTransfer' = t + 1
          /\ UNCHANGED <<pageVars, copyVars, free1, deferred1, deferred2, tags1, tags2, objects, fetched, unreported>>

(* A Fetch (at prepare_batch) maps a new page name into a batch's row and *)
(* starts reading the object under control's key k into it: a filling     *)
(* device copy and a staging host page (OutOfPages without either).        *)
Fetch(k) ==
    /\ nextPage \in Names /\ nextTransfer \in TIds /\ free1 # {} /\ free2 # {}
    /\ LET n == nextPage
           t == nextTransfer
           d == Min(free1)
           s == Min(free2)
       IN /\ holders' = [holders EXCEPT ![n] = 1] /\ nextPage' = nextPage + 1
          /\ state1' = [state1 EXCEPT ![n] = "filling"] /\ phys1' = [phys1 EXCEPT ![n] = d]
          /\ free1' = free1 \ {d} /\ free2' = free2 \ {s}
          /\ keys' = [keys EXCEPT ![n] = k] /\ fetched' = [fetched EXCEPT ![n] = TRUE]
          /\ transfers' = [transfers EXCEPT ![t] = [kind |-> "fetch", phase |-> "get", name |-> n, key |-> k,
                                                    src |-> -1, staging |-> s, dst |-> d]]
          /\ inflight' = inflight \cup {t} /\ nextTransfer' = t + 1
          /\ UNCHANGED <<versions, nextVersion, state2, phys2, deferred1, deferred2, tags1, tags2, objects, unreported>>

(* The compute of the batch a fetched page was mapped for: it waits for   *)
(* the fetch (KV_READY); if the fetch landed the page is an ordinary row  *)
(* page from now on, if it failed the batch fails and the page ends with  *)
(* it (its device copy is absent already: nothing to free).                *)
Execute(n) ==
    /\ fetched[n]
    /\ ~\E t \in inflight : transfers[t].kind = "fetch" /\ transfers[t].name = n
    /\ fetched' = [fetched EXCEPT ![n] = FALSE]
    /\ IF state1[n] = "valid"
         THEN UNCHANGED <<holders, keys>>
         ELSE holders' = [holders EXCEPT ![n] = 0] /\ keys' = [keys EXCEPT ![n] = 0]
    /\ UNCHANGED <<versions, nextPage, nextVersion, copyVars, poolVars, objects, transferVars>>

(* The last holder of a page name goes (a release, a close, or the cancel *)
(* of a fetch's batch): its copies' pages are freed, or deferred while a   *)
(* transfer touches them (O3).                                             *)
Release(n) ==
    /\ Live(n)
    /\ LET d == phys1[n]
           h == phys2[n]
           b1 == IF d # -1 THEN Blocking1(d, {}) ELSE {}
           b2 == IF h # -1 THEN Blocking2(h, {}) ELSE {}
       IN /\ holders' = [holders EXCEPT ![n] = 0]
          /\ state1' = [state1 EXCEPT ![n] = "absent"] /\ phys1' = [phys1 EXCEPT ![n] = -1]
          /\ state2' = [state2 EXCEPT ![n] = "absent"] /\ phys2' = [phys2 EXCEPT ![n] = -1]
          /\ free1' = IF d # -1 /\ b1 = {} THEN free1 \cup {d} ELSE free1
          /\ deferred1' = IF d # -1 /\ b1 # {} THEN [deferred1 EXCEPT ![d] = b1] ELSE deferred1
          /\ free2' = IF h # -1 /\ b2 = {} THEN free2 \cup {h} ELSE free2
          /\ deferred2' = IF h # -1 /\ b2 # {} THEN [deferred2 EXCEPT ![h] = b2] ELSE deferred2
          /\ keys' = [keys EXCEPT ![n] = 0] /\ fetched' = [fetched EXCEPT ![n] = FALSE]
          /\ UNCHANGED <<versions, nextPage, nextVersion, tags1, tags2, objects, transferVars>>

(* Control hears of the completions (poll_completions).                   *)
PollCompletions ==
    /\ unreported # <<>>
    /\ unreported' = <<>>
    /\ UNCHANGED <<pageVars, copyVars, poolVars, storeVars, transfers, inflight, nextTransfer>>

-----------------------------------------------------------------------------
(* The streams and the store (the environment).                           *)

(* A transfer leaves the streams: its staging page and the device pages  *)
(* `dropped` (a failed fetch's copy) are freed, the deferred frees that    *)
(* waited only for it run, and its completion is reported.                 *)
Finish(t, failure, dropped) ==
    LET s == transfers[t].staging
        f2 == IF s # -1 THEN free2 \cup {s} ELSE free2
    IN /\ inflight' = inflight \ {t}
       /\ free1' = free1 \cup dropped \cup Ready(deferred1, t) /\ deferred1' = RunDeferred(deferred1, t)
       /\ free2' = f2 \cup Ready(deferred2, t) /\ deferred2' = RunDeferred(deferred2, t)
       /\ unreported' = Append(unreported, [transferId |-> t, failure |-> failure])

(* The D2H of a staging persist lands: the staging page holds the device  *)
(* page's bytes, which the device page no longer needs to keep.           *)
StagePersist(t) ==
    /\ t \in inflight /\ transfers[t].kind = "persist" /\ transfers[t].phase = "stage"
    /\ LET tr == transfers[t]
       IN /\ tags2' = [tags2 EXCEPT ![tr.staging] = tags1[tr.src]]
          /\ transfers' = [transfers EXCEPT ![t].phase = "put"]
          /\ free1' = free1 \cup Ready(deferred1, t) /\ deferred1' = RunDeferred(deferred1, t)
          /\ UNCHANGED <<pageVars, copyVars, free2, deferred2, tags1, storeVars, inflight, nextTransfer, unreported>>

(* The store write of a persist lands: the object under its key holds the *)
(* bytes of the host page it read (the host copy, or staging).            *)
CompletePersist(t) ==
    /\ t \in inflight /\ transfers[t].kind = "persist" /\ transfers[t].phase = "put"
    /\ LET tr == transfers[t]
       IN /\ objects' = [objects EXCEPT ![tr.key] = tags2[IF tr.staging # -1 THEN tr.staging ELSE tr.src]]
          /\ Finish(t, "none", {})
          /\ UNCHANGED <<pageVars, copyVars, tags1, tags2, keys, fetched, transfers, nextTransfer>>

(* The store read of a fetch: the object under its key goes into staging; *)
(* if the store holds none (existence was a hint), the fetch misses: its  *)
(* device copy goes and the batch that reads it will fail.                *)
GetFetch(t) ==
    /\ t \in inflight /\ transfers[t].kind = "fetch" /\ transfers[t].phase = "get"
    /\ LET tr == transfers[t]
           n == tr.name
           mine == Live(n) /\ phys1[n] = tr.dst
       IN IF objects[tr.key] # 0
            THEN /\ tags2' = [tags2 EXCEPT ![tr.staging] = objects[tr.key]]
                 /\ transfers' = [transfers EXCEPT ![t].phase = "h2d"]
                 /\ UNCHANGED <<pageVars, copyVars, free1, free2, deferred1, deferred2, tags1, storeVars, inflight, nextTransfer, unreported>>
            ELSE /\ state1' = IF mine THEN [state1 EXCEPT ![n] = "absent"] ELSE state1
                 /\ phys1' = IF mine THEN [phys1 EXCEPT ![n] = -1] ELSE phys1
                 /\ Finish(t, "miss", IF mine THEN {tr.dst} ELSE {})
                 /\ UNCHANGED <<pageVars, state2, phys2, tags1, tags2, storeVars, transfers, nextTransfer>>

(* The H2D of a fetch lands: the device copy is valid and holds the        *)
(* object's bytes, which are now the page's last written tags.            *)
CompleteFetch(t) ==
    /\ t \in inflight /\ transfers[t].kind = "fetch" /\ transfers[t].phase = "h2d"
    /\ LET tr == transfers[t]
           n == tr.name
           mine == Live(n) /\ phys1[n] = tr.dst
       IN /\ tags1' = [tags1 EXCEPT ![tr.dst] = tags2[tr.staging]]
          /\ state1' = IF mine THEN [state1 EXCEPT ![n] = "valid"] ELSE state1
          /\ versions' = IF mine THEN [versions EXCEPT ![n] = tags2[tr.staging]] ELSE versions
          /\ Finish(t, "none", {})
          /\ UNCHANGED <<holders, nextPage, nextVersion, phys1, state2, phys2, tags2, storeVars, transfers, nextTransfer>>

(* A store operation (or its staging copy) fails, at any phase: a persist *)
(* writes nothing and leaves every copy as it was (F1); a fetch's device  *)
(* copy goes.  Either way the staging page is freed.                      *)
FailTransfer(t) ==
    /\ Faults /\ t \in inflight
    /\ LET tr == transfers[t]
           n == tr.name
           mine == tr.kind = "fetch" /\ Live(n) /\ phys1[n] = tr.dst
       IN /\ state1' = IF mine THEN [state1 EXCEPT ![n] = "absent"] ELSE state1
          /\ phys1' = IF mine THEN [phys1 EXCEPT ![n] = -1] ELSE phys1
          /\ Finish(t, "store", IF mine THEN {tr.dst} ELSE {})
          /\ UNCHANGED <<pageVars, state2, phys2, tags1, tags2, storeVars, transfers, nextTransfer>>

(* The store drops an object at any time (evicted, or removed by another  *)
(* runtime sharing the store).                                             *)
RemoveObject(k) ==
    /\ objects[k] # 0
    /\ objects' = [objects EXCEPT ![k] = 0]
    /\ UNCHANGED <<pageVars, copyVars, poolVars, keys, fetched, transferVars>>

Next ==
    \/ Write
    \/ \E n \in Names : Backup(n)
    \/ \E n \in Names : Persist(n)
    \/ \E k \in Keys : Fetch(k)
    \/ \E n \in Names : Execute(n)
    \/ \E n \in Names : Release(n)
    \/ PollCompletions
    \/ \E t \in TIds : StagePersist(t)
    \/ \E t \in TIds : CompletePersist(t)
    \/ \E t \in TIds : GetFetch(t)
    \/ \E t \in TIds : CompleteFetch(t)
    \/ \E t \in TIds : FailTransfer(t)
    \/ \E k \in Keys : RemoveObject(k)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants: the catalogue's ids (spec/invariants.md) this module checks. *)

(* R1: every physical page is exactly one of free, a page's copy,        *)
(* deferred, or (host pages) the staging of a transfer in flight.          *)
R1 == /\ \A p \in Phys1 : Cardinality({n \in Names : phys1[n] = p})
                          + (IF p \in free1 THEN 1 ELSE 0) + (IF deferred1[p] # {} THEN 1 ELSE 0) = 1
      /\ \A p \in Phys2 : Cardinality({n \in Names : phys2[n] = p}) + Cardinality({t \in inflight : transfers[t].staging = p})
                          + (IF p \in free2 THEN 1 ELSE 0) + (IF deferred2[p] # {} THEN 1 ELSE 0) = 1

(* O3: nothing an in-flight transfer reads or writes is free.             *)
O3 == \A t \in inflight : Touches1(t) \cap free1 = {} /\ Touches2(t) \cap free2 = {}

(* D1: every readable copy holds its page's last written tag.             *)
D1 == \A n \in Names : /\ state1[n] \in Readable => tags1[phys1[n]] = versions[n]
                       /\ state2[n] \in Readable => tags2[phys2[n]] = versions[n]

(* F1: every live page has a readable copy, but a fetched page nothing    *)
(* was written to (its fetch in flight, or failed and its batch to fail). *)
F1 == \A n \in Names : Live(n) /\ ~(fetched[n] /\ versions[n] = 0) => state1[n] \in Readable \/ state2[n] \in Readable

(* S1: in buffer_only mode no host page holds a copy of a page: every host *)
(* page in use stages a transfer in flight (or waits for one to finish).  *)
S1 == HostMode = "buffer_only" => \A n \in Names : state2[n] = "absent" /\ phys2[n] = -1

(* S2: a staging page is reused only after the store write (persist) or   *)
(* the device write (fetch) that uses it completed: while its transfer is *)
(* in flight it is neither free nor a page's copy.                        *)
S2 == \A s \in Staging : s \notin free2 /\ \A n \in Names : phys2[n] # s

(* S3: an object holds the bytes its key names, and so does every         *)
(* readable copy of a page that has a key: a fetch of a missing object    *)
(* misses, it never lands with other bytes.                               *)
S3 == /\ \A k \in Keys : objects[k] \in {0, k}
      /\ \A n \in Names : keys[n] # 0 /\ state1[n] \in Readable => tags1[phys1[n]] = keys[n]

=============================================================================
