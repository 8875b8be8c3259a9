-------------------------- MODULE SharedGPURuntime --------------------------
(***************************************************************************)
(* SharedGPURuntime as a design test (the design essay's, not a v1         *)
(* product): two control clients (schedulers) drive one runtime, which is  *)
(* the one allocator authority of a shared device pool.  One client's      *)
(* published extent can be attached by the other.  The question is which   *)
(* of the contract's invariants hold as they are with two clients, which   *)
(* need a client id in handles, and what publication and reference         *)
(* lifetime mean across clients (tla/README.md gives the findings).        *)
(*                                                                         *)
(* A self-contained abstraction of the part of CacheRuntime.tla the        *)
(* question touches, with its names (spec/glossary.md): request slots and  *)
(* rows, page names and holders, device copies and the device free list,   *)
(* extents, restores in flight.  Left out, as not touched by a second      *)
(* client: the host pool (the host tier is an unbounded backing store:     *)
(* every page can be demoted and restored), Backup and Drop, Split,        *)
(* version tags (D1), failures.  A batch is one item and is named by its   *)
(* request handle (one batch per row in flight), so a batch handle is      *)
(* checked as the request handle is.                                       *)
(*                                                                         *)
(* ClientIds says whether handles carry the client id, checked against the *)
(* calling client (the connection a call arrives on), with per-client      *)
(* reference counts in the runtime.  FALSE is the contract as it is: the   *)
(* runtime cannot tell its clients' handles apart.  Control is not trusted *)
(* to keep to its own handles: slot ids, generations and extent            *)
(* generations are small integers any client can name (a leaked or         *)
(* guessed handle, or a client's own bug such as a double release), so     *)
(* Next lets every client call with every current handle.  The variables   *)
(* of controlVars are what each client believes it holds; the runtime      *)
(* never reads them (ghost state for the cross-client properties).         *)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    Clients,            \* the control clients sharing the runtime
    ClientIds,          \* TRUE: handles carry the client id and the runtime checks it
    MaxRequests,        \* request slots (slot ids 0 .. MaxRequests-1), shared by all clients
    L1Pages,            \* physical device pages, one pool for all clients
    MaxRequestTokens,   \* max_request_tokens (page_size is 1: tokens = pages)
    MaxNames,           \* model bound: page names issued per epoch
    MaxExtents,         \* model bound: extent generations issued per epoch
    MaxGeneration,      \* model bound: a slot's generation
    MaxEpoch,           \* model bound: restarts
    MaxRefcount         \* model bound: references to one extent, all clients together

(***************************************************************************)
(* Variables, in groups; the runtime's groups are CacheRuntime.tla's,      *)
(* cut down, plus the owner of each slot and each client's references.     *)
(***************************************************************************)

\* The runtime: its epoch (a restart bumps it for every client).
VARIABLES
    epoch
runtimeVars == <<epoch>>

\* Request slots: generation, liveness, the client that opened each, its row.
VARIABLES
    generation,     \* generation[s]: slot s's current generation
    live,           \* live[s]: slot s holds an open request
    owner,          \* owner[s]: the client that opened slot s (NoClient when not live)
    pages,          \* pages[s]: the page names slot s's row maps, in token order
    numTokens       \* numTokens[s]: tokens computed in row s (Len(pages[s]) are reserved)
requestVars == <<generation, live, owner, pages, numTokens>>

\* Page names: how many live rows and extents hold each, the next name.
VARIABLES
    holders,        \* holders[n]: live rows and extents that map page name n (0: no such page)
    nextPage        \* the next page name to issue in this epoch
pageVars == <<holders, nextPage>>

\* Device copies: each page name's device copy and the physical page it occupies.
VARIABLES
    state1,         \* state1[n]: "absent" (host only) | "filling" (a restore in flight) | "valid"
    phys1           \* phys1[n]: the physical device page of that copy (-1 if none)
copyVars == <<state1, phys1>>

\* The device pool: the one free list of the one allocator authority, and deferred frees (O3).
VARIABLES
    free1,          \* the device free list (a queue of physical pages)
    deferred1       \* device pages freed while a restore still writes them
poolVars == <<free1, deferred1>>

\* Extents: references (all clients, and per client when handles carry the client id) and pages.
VARIABLES
    extents,        \* extents[g]: refcount (0: not live), refs[c] (ClientIds), page names
    nextExtent      \* the next extent generation to issue in this epoch
extentVars == <<extents, nextExtent>>

\* Transfers: the restores (H2D) in flight, each [client, name, dst].
VARIABLES
    inflight
transferVars == <<inflight>>

\* Control, per client (ghost: what each believes it holds; the runtime never reads it).
VARIABLES
    opened,         \* opened[c]: the slots client c opened and has not closed
    held,           \* held[c][g]: references to extent g that client c took and has not released
    granted         \* granted[c]: page names client c computed or was given an extent of
controlVars == <<opened, held, granted>>

vars == <<runtimeVars, requestVars, pageVars, copyVars, poolVars, extentVars, transferVars, controlVars>>

-----------------------------------------------------------------------------
(* Sets, records and canonical values.                                     *)

Slots == 0 .. MaxRequests - 1
Names == 0 .. MaxNames - 1
Phys1 == 0 .. L1Pages - 1
EIds == 1 .. MaxExtents
NoClient == "none"
CopyState == {"absent", "filling", "valid"}
Resident == {"filling", "valid"}     \* a device copy a plan may attach (NotResident otherwise)

(* Handles, as CacheRuntime.tla's with the client they were issued to.    *)
(* With ClientIds = FALSE the runtime ignores the field: the handle as it  *)
(* is today.                                                               *)
RequestHandles == [client : Clients, epoch : 0 .. MaxEpoch, slotId : Slots, generation : 0 .. MaxGeneration]
ExtentRefs == [client : Clients, epoch : 0 .. MaxEpoch, generation : EIds]
(* A restore in flight: who submitted it, the page name, the device page. *)
Transfers == [client : Clients, name : Names, dst : Phys1]

NoRefs == [c \in Clients |-> 0]
NoExtent == [refcount |-> 0, refs |-> NoRefs, pages |-> <<>>]

Range(s) == {s[i] : i \in DOMAIN s}
Count(s, x) == Cardinality({i \in DOMAIN s : s[i] = x})
Seq0(n) == [i \in 1 .. n |-> i - 1]      \* <<0, 1, ..., n-1>>
RECURSIVE SortedSeq(_)
SortedSeq(S) == IF S = {} THEN <<>>
                ELSE LET m == CHOOSE v \in S : \A w \in S : v <= w
                     IN <<m>> \o SortedSeq(S \ {m})
RECURSIVE Sum(_, _)
Sum(f, S) == IF S = {} THEN 0 ELSE LET x == CHOOSE y \in S : TRUE IN f[x] + Sum(f, S \ {x})

-----------------------------------------------------------------------------
(* Handle checks (H1), made by the runtime for the calling client c: a     *)
(* handle is valid only in its epoch, at its slot's generation, for a live *)
(* extent; with ClientIds also only for the client it was issued to, and   *)
(* a reference only while that client holds one (ForeignClient otherwise). *)

ValidReq(c, h) == /\ h.epoch = epoch
                  /\ h.slotId \in Slots
                  /\ h.generation = generation[h.slotId]
                  /\ live[h.slotId]
                  /\ ClientIds => h.client = c /\ owner[h.slotId] = c          \* ForeignClient
ValidExt(c, x) == /\ x.epoch = epoch
                  /\ x.generation \in EIds
                  /\ extents[x.generation].refcount > 0
                  /\ ClientIds => x.client = c /\ extents[x.generation].refs[c] > 0  \* ForeignClient

RowHeld == UNION {Range(pages[s]) : s \in {s2 \in Slots : live[s2]}}
Reserved(s) == Len(pages[s]) > numTokens[s]    \* a batch of row s is prepared, not executed

(* Every page name of sequence S loses one holder; a page whose count     *)
(* reaches 0 ends: its device page is freed, or deferred while a restore   *)
(* still writes it (O3).                                                   *)
Ending(S) == {n \in Range(S) : holders[n] = Count(S, n)}
DropHolders(S) ==
    LET ending == Ending(S)
        gone(st) == {phys1[n] : n \in {m \in ending : state1[m] = st}}
    IN /\ holders' = [n \in Names |-> holders[n] - Count(S, n)]
       /\ state1' = [n \in Names |-> IF n \in ending THEN "absent" ELSE state1[n]]
       /\ phys1' = [n \in Names |-> IF n \in ending THEN -1 ELSE phys1[n]]
       /\ free1' = free1 \o SortedSeq(gone("valid"))
       /\ deferred1' = deferred1 \cup gone("filling")

(* KV_READY for row s of client c: no restore into a page the row reads   *)
(* is in flight, whichever client submitted it (the runtime's events, not  *)
(* c's; mutant-shared-kv-ready-own-transfers waits for c's alone).         *)
KVReady(c, s) == \A t \in inflight : t.name \notin Range(pages[s])

-----------------------------------------------------------------------------
TypeOK ==
    /\ epoch \in 0 .. MaxEpoch
    /\ generation \in [Slots -> 0 .. MaxGeneration]
    /\ live \in [Slots -> BOOLEAN]
    /\ owner \in [Slots -> Clients \cup {NoClient}]
    /\ \A s \in Slots : pages[s] \in Seq(Names) /\ Len(pages[s]) <= MaxRequestTokens
    /\ numTokens \in [Slots -> 0 .. MaxRequestTokens]
    /\ holders \in [Names -> Nat]
    /\ nextPage \in 0 .. MaxNames
    /\ state1 \in [Names -> CopyState]
    /\ phys1 \in [Names -> Phys1 \cup {-1}]
    /\ free1 \in Seq(Phys1)
    /\ deferred1 \subseteq Phys1
    /\ \A g \in EIds : /\ extents[g].refcount \in 0 .. MaxRefcount
                       /\ extents[g].refs \in [Clients -> 0 .. MaxRefcount]
                       /\ extents[g].pages \in Seq(Names)
    /\ nextExtent \in 1 .. MaxExtents + 1
    /\ inflight \subseteq Transfers
    /\ opened \in [Clients -> SUBSET Slots]
    /\ held \in [Clients -> [EIds -> Nat]]
    /\ granted \in [Clients -> SUBSET Names]

Init ==
    /\ epoch = 0
    /\ generation = [s \in Slots |-> 0]
    /\ live = [s \in Slots |-> FALSE]
    /\ owner = [s \in Slots |-> NoClient]
    /\ pages = [s \in Slots |-> <<>>]
    /\ numTokens = [s \in Slots |-> 0]
    /\ holders = [n \in Names |-> 0]
    /\ nextPage = 0
    /\ state1 = [n \in Names |-> "absent"]
    /\ phys1 = [n \in Names |-> -1]
    /\ free1 = Seq0(L1Pages)
    /\ deferred1 = {}
    /\ extents = [g \in EIds |-> NoExtent]
    /\ nextExtent = 1
    /\ inflight = {}
    /\ opened = [c \in Clients |-> {}]
    /\ held = [c \in Clients |-> [g \in EIds |-> 0]]
    /\ granted = [c \in Clients |-> {}]

-----------------------------------------------------------------------------
(* Actions: one per boundary operation, the first argument the calling     *)
(* client; plus the environment's CompleteTransfer.                        *)

\* OpenRequest: the lowest slot that is not live opens for client c with an empty row.
OpenRequest(c) ==
    /\ \E s \in Slots : ~live[s]
    /\ LET s == CHOOSE v \in Slots : ~live[v] /\ \A w \in Slots : ~live[w] => v <= w
       IN /\ live' = [live EXCEPT ![s] = TRUE]
          /\ owner' = [owner EXCEPT ![s] = c]
          /\ opened' = [opened EXCEPT ![c] = @ \cup {s}]
    /\ UNCHANGED <<runtimeVars, generation, pages, numTokens, pageVars, copyVars, poolVars, extentVars,
                   transferVars, held, granted>>

\* CloseRequest: the slot closes at a new generation (H2) and its row's pages lose a holder
\* (RequestBusy while a batch of it is prepared); the caller no longer counts it as open.
CloseRequest(c, h) ==
    LET s == h.slotId IN
    /\ ValidReq(c, h)
    /\ ~Reserved(s)                                                     \* RequestBusy
    /\ generation[s] < MaxGeneration                                    \* model bound
    /\ live' = [live EXCEPT ![s] = FALSE]
    /\ generation' = [generation EXCEPT ![s] = @ + 1]
    /\ owner' = [owner EXCEPT ![s] = NoClient]
    /\ pages' = [pages EXCEPT ![s] = <<>>]
    /\ numTokens' = [numTokens EXCEPT ![s] = 0]
    /\ DropHolders(pages[s])
    /\ opened' = [opened EXCEPT ![c] = @ \ {s}]
    /\ UNCHANGED <<runtimeVars, nextPage, extentVars, transferVars, held, granted>>

\* PrepareBatch: a one-item plan for row h, attaching the extents of `attach` (at most one, on an
\* empty row, each page resident), reserves one new page on the first free device page.
PrepareBatch(c, h, attach) ==
    LET s == h.slotId
        attached == IF attach = <<>> THEN <<>> ELSE extents[attach[1].generation].pages
        n == nextPage
    IN
    /\ ValidReq(c, h)
    /\ \A j \in DOMAIN attach : ValidExt(c, attach[j])
    /\ ~Reserved(s)                                                     \* OutOfOrder (one batch a row)
    /\ attach # <<>> => Len(pages[s]) = 0                               \* InvalidPlan
    /\ \A m \in Range(attached) : state1[m] \in Resident                \* NotResident
    /\ Len(pages[s]) + Len(attached) + 1 <= MaxRequestTokens            \* RowFull
    /\ Len(free1) >= 1                                                  \* OutOfPages(L1)
    /\ nextPage < MaxNames                                              \* model bound
    /\ pages' = [pages EXCEPT ![s] = @ \o attached \o <<n>>]
    /\ holders' = [m \in Names |-> IF m = n THEN 1 ELSE holders[m] + Count(attached, m)]
    /\ nextPage' = nextPage + 1
    /\ state1' = [state1 EXCEPT ![n] = "valid"]
    /\ phys1' = [phys1 EXCEPT ![n] = Head(free1)]
    /\ free1' = Tail(free1)
    /\ granted' = [granted EXCEPT ![owner[s]] = @ \cup {n}]            \* the row's client computes it
    /\ UNCHANGED <<runtimeVars, generation, live, owner, numTokens, deferred1, extentVars, transferVars,
                   opened, held>>

\* ExecuteBatch: the prepared batch of row h computes once KV_READY (O1): its row's tokens count.
ExecuteBatch(c, h) ==
    /\ ValidReq(c, h)
    /\ Reserved(h.slotId)                                               \* NotPrepared
    /\ KVReady(c, h.slotId)
    /\ numTokens' = [numTokens EXCEPT ![h.slotId] = Len(pages[h.slotId])]
    /\ UNCHANGED <<runtimeVars, generation, live, owner, pages, pageVars, copyVars, poolVars, extentVars,
                   transferVars, controlVars>>

\* Publish: computed pages first+1..first+count of row h become an extent with one reference, the
\* caller's; each page gains a holder (InvalidPageRun).
Publish(c, h, first, count) ==
    LET ps == SubSeq(pages[h.slotId], first + 1, first + count) IN
    /\ ValidReq(c, h)
    /\ count >= 1 /\ first >= 0 /\ first + count <= numTokens[h.slotId]
    /\ nextExtent <= MaxExtents                                         \* model bound
    /\ holders' = [n \in Names |-> holders[n] + Count(ps, n)]
    /\ extents' = [extents EXCEPT ![nextExtent] =
                     [refcount |-> 1, refs |-> IF ClientIds THEN [NoRefs EXCEPT ![c] = 1] ELSE NoRefs, pages |-> ps]]
    /\ nextExtent' = nextExtent + 1
    /\ held' = [held EXCEPT ![c][nextExtent] = 1]
    /\ UNCHANGED <<runtimeVars, requestVars, nextPage, copyVars, poolVars, transferVars, opened, granted>>

\* Retain: the caller takes one more reference to extent x.
Retain(c, x) ==
    LET g == x.generation IN
    /\ ValidExt(c, x)
    /\ extents[g].refcount < MaxRefcount                                \* model bound
    /\ extents' = [extents EXCEPT ![g].refcount = @ + 1,
                                  ![g].refs = IF ClientIds THEN [@ EXCEPT ![c] = @ + 1] ELSE @]
    /\ held' = [held EXCEPT ![c][g] = @ + 1]
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, nextExtent, transferVars, opened,
                   granted>>

\* Share (publication): the caller, holding a reference to extent x, gives client d a reference of
\* its own, in one step, so that the extent cannot end between the giving and the taking.
Share(c, x, d) ==
    LET g == x.generation IN
    /\ d # c
    /\ ValidExt(c, x)
    /\ extents[g].refcount < MaxRefcount                                \* model bound
    /\ extents' = [extents EXCEPT ![g].refcount = @ + 1,
                                  ![g].refs = IF ClientIds THEN [@ EXCEPT ![d] = @ + 1] ELSE @]
    /\ held' = [held EXCEPT ![d][g] = @ + 1]
    /\ granted' = [granted EXCEPT ![d] = @ \cup Range(extents[g].pages)]
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, copyVars, poolVars, nextExtent, transferVars, opened>>

\* Release: extent x loses one of the caller's references; with the last reference of all clients it
\* ends and its pages lose a holder.  A client that holds none believes it gave nothing back.
Release(c, x) ==
    LET g == x.generation IN
    /\ ValidExt(c, x)
    /\ IF extents[g].refcount = 1
         THEN /\ extents' = [extents EXCEPT ![g] = NoExtent]
              /\ DropHolders(extents[g].pages)
         ELSE /\ extents' = [extents EXCEPT ![g].refcount = @ - 1,
                                            ![g].refs = IF ClientIds THEN [@ EXCEPT ![c] = @ - 1] ELSE @]
              /\ UNCHANGED <<holders, copyVars, poolVars>>
    /\ held' = [held EXCEPT ![c][g] = IF @ > 0 THEN @ - 1 ELSE 0]
    /\ UNCHANGED <<runtimeVars, requestVars, nextPage, nextExtent, transferVars, opened, granted>>

\* SubmitDemote: the device copies of extent x go to the host tier (NotResident while one is still
\* filling; ExtentInUse while a live row of any client maps one).
SubmitDemote(c, x) ==
    LET ps == extents[x.generation].pages IN
    /\ ValidExt(c, x)
    /\ \A n \in Range(ps) : state1[n] = "valid"                         \* NotResident
    /\ Range(ps) \cap RowHeld = {}                                      \* ExtentInUse
    /\ state1' = [n \in Names |-> IF n \in Range(ps) THEN "absent" ELSE state1[n]]
    /\ phys1' = [n \in Names |-> IF n \in Range(ps) THEN -1 ELSE phys1[n]]
    /\ free1' = free1 \o SortedSeq({phys1[n] : n \in Range(ps)})
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, deferred1, extentVars, transferVars, controlVars>>

\* SubmitRestore: each page of extent x without a device copy gets one (filling) on a free device
\* page and its H2D starts (OutOfPages(L1)).
SubmitRestore(c, x) ==
    LET ps == extents[x.generation].pages
        rs == SortedSeq({n \in Range(ps) : state1[n] = "absent"})
        dst(n) == free1[CHOOSE i \in 1 .. Len(rs) : rs[i] = n]
    IN
    /\ ValidExt(c, x)
    /\ rs # <<>>                                                        \* nothing to move: not modelled
    /\ Len(rs) <= Len(free1)                                            \* OutOfPages(L1)
    /\ state1' = [n \in Names |-> IF n \in Range(rs) THEN "filling" ELSE state1[n]]
    /\ phys1' = [n \in Names |-> IF n \in Range(rs) THEN dst(n) ELSE phys1[n]]
    /\ free1' = SubSeq(free1, Len(rs) + 1, Len(free1))
    /\ inflight' = inflight \cup {[client |-> c, name |-> n, dst |-> dst(n)] : n \in Range(rs)}
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, deferred1, extentVars, controlVars>>

\* CompleteTransfer (environment): a restore lands; its copy is valid, or, when its page ended while
\* it was filling, the deferred device page is free now.
CompleteTransfer(t) ==
    /\ t \in inflight
    /\ inflight' = inflight \ {t}
    /\ IF state1[t.name] = "filling" /\ phys1[t.name] = t.dst
         THEN /\ state1' = [state1 EXCEPT ![t.name] = "valid"]
              /\ UNCHANGED <<free1, deferred1>>
         ELSE /\ free1' = Append(free1, t.dst)
              /\ deferred1' = deferred1 \ {t.dst}
              /\ UNCHANGED state1
    /\ UNCHANGED <<runtimeVars, requestVars, pageVars, phys1, extentVars, controlVars>>

\* Restart: once nothing is in flight, everything but the epoch is forgotten, for every client:
\* each learns the new epoch and holds nothing.
Restart(c) ==
    /\ inflight = {}
    /\ epoch < MaxEpoch /\ \A s \in Slots : live[s] => generation[s] < MaxGeneration  \* model bounds
    /\ epoch' = epoch + 1
    /\ generation' = [s \in Slots |-> IF live[s] THEN generation[s] + 1 ELSE generation[s]]
    /\ live' = [s \in Slots |-> FALSE]
    /\ owner' = [s \in Slots |-> NoClient]
    /\ pages' = [s \in Slots |-> <<>>]
    /\ numTokens' = [s \in Slots |-> 0]
    /\ holders' = [n \in Names |-> 0]
    /\ nextPage' = 0
    /\ state1' = [n \in Names |-> "absent"]
    /\ phys1' = [n \in Names |-> -1]
    /\ free1' = Seq0(L1Pages)
    /\ deferred1' = {}
    /\ extents' = [g \in EIds |-> NoExtent]
    /\ nextExtent' = 1
    /\ opened' = [d \in Clients |-> {}]
    /\ held' = [d \in Clients |-> [g \in EIds |-> 0]]
    /\ granted' = [d \in Clients |-> {}]
    /\ UNCHANGED transferVars

-----------------------------------------------------------------------------
(* The next-state relation: every client calls every operation with every  *)
(* current handle, its own or another client's (ReqH names the slot's      *)
(* handle as issued; ExtH is the caller's reference to an extent); the     *)
(* environment completes restores.                                         *)

ReqH(s) == [client |-> owner[s], epoch |-> epoch, slotId |-> s, generation |-> generation[s]]
ExtH(c, g) == [client |-> c, epoch |-> epoch, generation |-> g]
LiveExts == {g \in EIds : extents[g].refcount > 0}
LiveSlots == {s \in Slots : live[s]}

Next ==
    \/ \E c \in Clients : OpenRequest(c)
    \/ \E c \in Clients, s \in Slots : CloseRequest(c, ReqH(s))
    \/ \E c \in Clients, s \in Slots : PrepareBatch(c, ReqH(s), <<>>)
    \/ \E c \in Clients, s \in Slots, g \in EIds : PrepareBatch(c, ReqH(s), <<ExtH(c, g)>>)
    \/ \E c \in Clients, s \in Slots : ExecuteBatch(c, ReqH(s))
    \/ \E c \in Clients, s \in Slots, f \in 0 .. MaxRequestTokens - 1, k \in 1 .. MaxRequestTokens :
          Publish(c, ReqH(s), f, k)
    \/ \E c \in Clients, g \in EIds : Retain(c, ExtH(c, g))
    \/ \E c, d \in Clients, g \in EIds : Share(c, ExtH(c, g), d)
    \/ \E c \in Clients, g \in EIds : Release(c, ExtH(c, g))
    \/ \E c \in Clients, g \in EIds : SubmitDemote(c, ExtH(c, g))
    \/ \E c \in Clients, g \in EIds : SubmitRestore(c, ExtH(c, g))
    \/ \E c \in Clients : Restart(c)
    \/ \E t \in Transfers : CompleteTransfer(t)

Spec == Init /\ [][Next]_vars

(* For model checking only (the VIEW of MCSharedAnonymous.cfg): without    *)
(* ClientIds the runtime reads neither owner nor controlVars, so states    *)
(* that differ only there behave alike for the runtime's invariants (the   *)
(* ghost counts of a client that releases references it does not hold      *)
(* would otherwise grow without bound).                                    *)
RuntimeView == <<runtimeVars, generation, live, pages, numTokens, pageVars, copyVars, poolVars, extentVars,
                 transferVars>>

-----------------------------------------------------------------------------
(* Invariants of the runtime, named by catalogue id where they are the     *)
(* catalogue's property (spec/invariants.md), stated for all clients'      *)
(* rows and extents together.                                              *)

StaleReq(h) == h.epoch < epoch \/ (h.epoch = epoch /\ h.generation < generation[h.slotId])
StaleExt(x) == x.epoch < epoch \/ (x.epoch = epoch /\ x.generation < nextExtent /\ extents[x.generation].refcount = 0)

(* H1: no operation of any client given a stale handle is enabled.         *)
H1_StaleRequestHandle ==
    \A c \in Clients, h \in RequestHandles : StaleReq(h) =>
        /\ ~ENABLED CloseRequest(c, h)
        /\ ~ENABLED Publish(c, h, 0, 1)
        /\ ~ENABLED PrepareBatch(c, h, <<>>)
        /\ ~ENABLED ExecuteBatch(c, h)
H1_StaleExtentRef ==
    \A c \in Clients, x \in ExtentRefs : StaleExt(x) =>
        /\ ~ENABLED Retain(c, x)
        /\ ~ENABLED Release(c, x)
        /\ ~ENABLED SubmitDemote(c, x)
        /\ ~ENABLED SubmitRestore(c, x)
        /\ \A d \in Clients : ~ENABLED Share(c, x, d)
H1 == H1_StaleRequestHandle /\ H1_StaleExtentRef

(* H1 across clients (needs ClientIds): no operation is enabled for a      *)
(* client given a handle issued to another, or a reference it does not     *)
(* hold.                                                                   *)
H1_ForeignHandle ==
    /\ \A c \in Clients, s \in LiveSlots : owner[s] # c =>
          LET h == ReqH(s) IN
          /\ ~ENABLED CloseRequest(c, h)
          /\ ~ENABLED Publish(c, h, 0, 1)
          /\ ~ENABLED PrepareBatch(c, h, <<>>)
          /\ ~ENABLED ExecuteBatch(c, h)
    /\ \A c \in Clients, g \in LiveExts : held[c][g] = 0 =>
          LET x == ExtH(c, g) IN
          /\ ~ENABLED Retain(c, x)
          /\ ~ENABLED Release(c, x)
          /\ ~ENABLED SubmitDemote(c, x)
          /\ ~ENABLED SubmitRestore(c, x)

(* H2 (an action property): generations never decrease, and a slot that   *)
(* stops being live moves to a new generation.                             *)
H2 == [][\A s \in Slots : /\ generation'[s] >= generation[s]
                          /\ (live[s] /\ ~live'[s]) => generation'[s] > generation[s]]_vars

(* H3: at most one request handle per slot is current, whichever client  *)
(* presents it (without ClientIds the client field is not part of the     *)
(* handle, so handles differing only there are one).                      *)
Key(h) == IF ClientIds THEN h ELSE [epoch |-> h.epoch, slotId |-> h.slotId, generation |-> h.generation]
H3 == \A s \in Slots :
        Cardinality({Key(h) : h \in {h2 \in RequestHandles : h2.slotId = s /\ \E c \in Clients : ValidReq(c, h2)}}) <= 1

Mapped1 == {phys1[n] : n \in {m \in Names : state1[m] # "absent"}}
CopiesOf1(p) == Cardinality({n \in Names : state1[n] # "absent" /\ phys1[n] = p})

(* R1: every device page is exactly one of free, mapped to one page name's *)
(* copy, or deferred: one allocator for all clients.                       *)
R1 == \A p \in Phys1 : Count(free1, p) + CopiesOf1(p) + (IF p \in deferred1 THEN 1 ELSE 0) = 1

Held(n) == (\E s \in LiveSlots : n \in Range(pages[s])) \/ (\E g \in LiveExts : n \in Range(extents[g].pages))

(* R2: no device page of a page name held by a live row or live extent of *)
(* any client is free; every held page name exists.                        *)
R2 == \A n \in Names : Held(n) => holders[n] > 0 /\ (state1[n] # "absent" => phys1[n] \notin Range(free1))

(* R3: a page's holder count equals its live rows and extents, of every   *)
(* client.                                                                 *)
HolderCount(n) == Cardinality({<<s, i>> \in LiveSlots \X (1 .. MaxRequestTokens) : i <= Len(pages[s]) /\ pages[s][i] = n})
                  + Cardinality({<<g, i>> \in LiveExts \X (1 .. MaxRequestTokens) :
                                   i <= Len(extents[g].pages) /\ extents[g].pages[i] = n})
R3 == \A n \in Names : holders[n] = HolderCount(n)

(* R4: no device page is free twice, or free while mapped or deferred.    *)
R4 == /\ \A p \in Phys1 : Count(free1, p) <= 1
      /\ Range(free1) \cap (Mapped1 \cup deferred1) = {}

(* O1: every page a live row of any client computed over has a valid      *)
(* device copy: compute waited for KV_READY of restores any client began. *)
O1 == \A s \in LiveSlots : \A i \in 1 .. numTokens[s] : state1[pages[s][i]] = "valid"

(* O3: no device page a restore in flight writes is free.                 *)
O3 == \A t \in inflight : t.dst \notin Range(free1)

-----------------------------------------------------------------------------
(* Properties across clients: what each client believes it holds is what *)
(* the runtime holds for it.  No catalogue id: they are this design test's *)
(* (tla/README.md), not v1's.                                              *)

(* OwnRequests: a request a client opened stays open, and that client's,  *)
(* until it closes it (or a restart ends every request).                  *)
OwnRequests == \A c \in Clients : \A s \in opened[c] : live[s] /\ owner[s] = c

(* OwnReferences: the runtime counts exactly the references the clients   *)
(* hold, so no client's release ends a reference another still holds; with *)
(* ClientIds the runtime's count per client is that client's.              *)
OwnReferences == \A g \in EIds :
    /\ extents[g].refcount = Sum([c \in Clients |-> held[c][g]], Clients)
    /\ ClientIds => \A c \in Clients : extents[g].refs[c] = held[c][g]

(* ReadsGranted: every page a client's row maps or its references cover   *)
(* was computed by that client or shared with it (publication).           *)
ReadsGranted ==
    /\ \A s \in LiveSlots : Range(pages[s]) \subseteq granted[owner[s]]
    /\ \A c \in Clients, g \in LiveExts : held[c][g] > 0 => Range(extents[g].pages) \subseteq granted[c]
=============================================================================
