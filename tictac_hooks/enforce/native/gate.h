// The TicTac ordering gate, in-process: one counter per (step_id, destination device)
// that hands RecvTensor responses to gRPC in priority order, at the sender (paper
// section 5). Plain C++17, no TensorFlow types: the TensorFlow glue (tf_server.cc)
// and the C API for tests (capi.cc) both drive this class.
//
// A transfer arrives (its request was parsed), then becomes ready (the PS produced its
// response). A listed transfer with local priority p is handed back once p transfers of
// its (step, destination) have been handed back or skipped; the counter advances at the
// hand-back. No round trip separates the hand-back from the counter here, so there is
// no look-ahead window: the next transfer is handed to gRPC the moment its turn comes.
// Pacing (when pace_rate > 0): gRPC interleaves the responses it holds on one HTTP/2
// connection, so responses handed to it together share the link and finish together,
// whatever order they were handed in. The gate therefore keeps a virtual queue of the
// bytes it handed back, drained at pace_rate (the PS's link rate), and hands the next
// listed transfer whose turn came only while that backlog is at most pace_window
// bytes: enough to keep the link busy, little enough that the wire keeps the order.
// Which waiting transfer goes when the link has room: one whose turn came in the
// earliest *turn*. A turn is a round of the job's workers at this gate: a worker's
// new channel joins the round its job is in while a channel of that round (another
// worker's) is still being served here (held, in flight, or with listed transfers to
// come), and begins the next round otherwise (no one else's step is in flight here,
// or the worker has a channel in the round already).
// So a round holds the steps served together, each worker's once, whatever else a
// worker opened before (a master's one-off read, a step of its own during setup); a
// worker that comes back from a pause, alone or with all the others, is in the round
// of the others' concurrent step; and the workers' steps of one iteration, which
// reach every PS together, form the same rounds at every PS without a word between
// them: a worker is served at each PS in the same turn, not first at one PS and last
// at another as arrival order would (with several PS a worker finishes at its worst
// PS). Within a turn, with align on
// (the default) the destination that has had the fewest handed back, so every worker
// gets its k-th transfer before any gets its (k+1)-th; with align off the lowest task
// index first, so the workers are served one after the other (their pulls, and so
// their compute and gradient pushes, are staggered), in the same order at every PS.
// Work conservation (opt-in, conserve_after_s >= 0, with pacing): a strict order holds
// the link idle while the transfer whose turn came has not been requested yet (on a
// fast link the workers' requests, not the wire, set the pace, and every enforced
// order measured slower than none). With it on, once the link has been idle and a
// ready transfer has waited conserve_after_s, the waiter with the earliest priority of
// the earliest turn goes out of turn (it counts as handed back; the record shows it as
// reordered), so the order only holds while the link has work.
// Never waits forever: when the counter stands still for skip_after_s while a later
// transfer waits, the transfer it waits for is skipped ("slow" if its request came,
// "timeout" if not); one skipped for not coming in presume_absent_after consecutive
// steps to the same destination is skipped at once from then on ("absent"). Unlisted
// transfers pass straight through.
// A step's life is measured in time, never in other steps: a (step, destination)
// channel is finished once nothing of it is held or in flight and it has been quiet
// for finish_after_s (its record is then numbered and readable), or, whatever it
// holds, once it has been quiet for stale_after_s. Only then, at shutdown, or when
// more than max_active_steps steps are live at once (a memory bound, sized with the
// workers, that a healthy cluster never reaches) does the gate let a transfer go out
// of its order; each such transfer's record says why ("early": stale, evicted,
// shutdown) and the summary counts them. A request that comes after its channel
// finished passes straight through ("after_finish" in the totals), never waiting on
// a counter that starts again at 0. One worker is one task: the destination is the
// key's task (/job:worker/replica:0/task:N), whatever device of it the read lands on. The same semantics as the Python gate (enforce/gate.py) with window 0;
// tests/enforce/test_gate_conformance.py runs both on one set of scenarios.
#ifndef TICTAC_ENFORCE_NATIVE_GATE_H_
#define TICTAC_ENFORCE_NATIVE_GATE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace tictac {

enum class State { kPass, kListed, kLate, kUnexpected, kDuplicate };
const char* StateName(State s);

// What the gate's bounds hold at `workers` workers (WorkerBounds): history
// kRecordsPerWorker records per worker, kLiveStepsPerWorker live steps per worker.
constexpr int kDefaultWorkers = 64;       // DEFAULT_WORKERS (enforce/gate.py)
constexpr int kRecordsPerWorker = 64;     // records kept per worker between two reads
constexpr int kLiveStepsPerWorker = 256;  // live steps per worker before eviction

struct Options {
  double skip_after_s = 2.0;  // DEFAULT_SKIP_AFTER_S (enforce/gate.py); Python always sets it
  int presume_absent_after = 2;
  int max_active_steps = kLiveStepsPerWorker * kDefaultWorkers;
  int history = kRecordsPerWorker * kDefaultWorkers;
  double finish_after_s = 1.0;  // DEFAULT_FINISH_AFTER_S: quiet this long, a channel is done
  double stale_after_s = 60.0;  // quiet this long, finished whatever it holds
  size_t max_served_names = 100000;
  double pace_rate = 0;             // bytes/s of the PS's link; 0: no pacing
  int64_t pace_window = 256 << 10;  // backlog (bytes) up to which the next one goes
  bool align = true;                // within a step, the furthest-behind destination first
  double conserve_after_s = -1;     // work conservation (see above); < 0: off
};

// A worker that opens no step here for this many finish bounds (finish_after_s) and
// then opens one comes back (it was preempted and restarted, or every worker paused
// together: an epoch end, a checkpoint, an evaluation); the totals count it
// ("returned"), and "rejoined" where its turn is not the one after its last.
constexpr double kRejoinAfterFinishes = 10;

// One schedule entry: transfer name and its global priority.
using Entry = std::pair<std::string, int>;

// (transfer name, destination device, full tensor name, loop frame and iteration) of a
// rendezvous key "src;incarnation;dst;edge_<n>_<name>;frame:iter"; the Python twin is
// graph/tf/naming.py:parse_rendezvous_key. Outside loops frame:iter is 0:0; inside a
// while loop (Keras's steps_per_execution > 1 runs its training steps in one) each
// iteration has its own iter, and is a training step of its own: the gate keeps one
// counter per (step_id, destination, frame, iter).
struct Key {
  std::string name, dest, tensor;
  uint64_t frame = 0;
  int64_t iter = 0;
};
Key ParseRendezvousKey(const std::string& key);
// "/job:worker/replica:0/task:3/device:GPU:1" -> "/job:worker/replica:0/task:3": one
// worker is one task (graph/tf/naming.py:worker_of).
std::string WorkerOf(const std::string& device);
// "/job:worker/replica:0/task:12" -> 12; -1 where the name has no task index.
int64_t TaskIndex(const std::string& worker);
std::string SendingNodeName(const std::string& tensor);  // strips "^edge_\d+_"

struct Installed;
struct Channel;
using HandBack = std::function<void()>;
// Where a waiting channel stands in the paced service's indexes (Gate::Index):
// (turn, a rank within the turn, task index, step seq, destination).
using PaceKey = std::tuple<int64_t, int64_t, int64_t, int64_t, std::string>;

struct Ticket {
  int64_t step_id = 0;
  std::string dest, name;
  std::string tensor;  // the key's full tensor name, where it is not ``name``
  State state = State::kPass;
  int priority = -1;
  int64_t seq = 0;
  int64_t rseq = -1;  // hand-back order among listed transfers, gate-wide
  double t_arrive = 0, t_ready = 0, t_handback = 0;
  double t_wait = 0;  // steady clock: when it joined the waiters
  int64_t nbytes = 0;
  std::string error;
  const char* early = "";  // why it went out of its order ("": it did not), see above
  bool dead = false;  // a dead tensor (a loop's exit iteration): handed back at once
  Channel* channel = nullptr;  // valid while the step is active (guarded by the gate)
  HandBack hand_back;          // held while the ticket waits for its turn
};
using TicketPtr = std::shared_ptr<Ticket>;

class Gate {
 public:
  explicit Gate(Options options = Options());
  ~Gate();  // hands back whatever is held, stops the timer thread
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Installs a schedule (entries sorted by priority, priorities in [0, n)); steps that
  // start from now on run under it. Returns the install result as JSON, or "" with
  // *error set for a malformed schedule.
  std::string Install(const std::string& algorithm, const std::vector<Entry>& order,
                      std::string* error);
  // Removes the schedule; returns the new version number.
  int64_t Clear();
  // Sets the skip bound (if > 0) and the presume-absent count (if >= 0); false with
  // *error for a bound that is not finite.
  // pace_rate >= 0 (bytes/s, 0: off) and pace_window >= 0 (bytes) when not negative.
  // align: 1 aligned, 0 the destinations of a step one after the other, -1 unchanged.
  // conserve_after_s: >= 0 on (seconds), -1 off, -2 unchanged.
  bool Configure(double skip_after_s, int presume_absent_after, std::string* error,
                 double pace_rate = -1, int64_t pace_window = -1, int align = -1,
                 double conserve_after_s = -2);
  // Sizes the history and the live-step bound for `workers` workers (0: unchanged), and sets
  // finish_after_s and stale_after_s (each if > 0); false with *error for a value out of
  // range.
  bool Size(int workers, double finish_after_s, double stale_after_s, std::string* error);

  // The transfer path. Arrive when the request is parsed; Ready when the response is
  // produced, with the closure that hands it to gRPC. The closure runs exactly once,
  // on this thread, a later Ready's thread or the timer thread, never under the lock.
  TicketPtr Arrive(int64_t step_id, const std::string& rendezvous_key);
  // A dead response (is_dead: the exit iteration of a loop sends every body transfer
  // once more, carrying nothing) is handed back at once and recorded as dead.
  void Ready(const TicketPtr& ticket, int64_t nbytes, const std::string& error,
             HandBack hand_back, bool dead = false);

  // The summary and step records. Finished records are numbered in the order they
  // finished (seq, from 1, gate-wide; worker_seq, from 1, per destination): the reply
  // holds those after `since` (0: every one still held), the active ones when asked,
  // "last_seq" (the newest number given) and "dropped" (records after `since` that the
  // history bound let go before this read). A reader that passes the last_seq of its
  // previous read gets each record once and learns what it missed.
  std::string StatsJson(bool include_active, int64_t since = 0);
  std::string ServedJson();
  std::string SummaryJson();

  // A measurement setting: while bypassed, the server hands every RecvTensor to the
  // stock worker code as a plain PS would (no ticket, no record, no order), so that
  // one process can compare the gate's path with TensorFlow's own. Install refuses
  // while it is on, and ping reports it.
  void SetBypass(bool on) { bypass_.store(on, std::memory_order_relaxed); }
  bool Bypassed() const { return bypass_.load(std::memory_order_relaxed); }

 private:
  using Runs = std::vector<HandBack>;
  double Now() const;
  // `step_id` is the gate's key of the step, `request_step_id` the request's step id.
  Channel* GetChannel(int64_t step_id, int64_t request_step_id, const std::string& dest,
                      double now, Runs* runs);
  void ArriveOn(Channel* ch, int64_t step_id, const Key& key, double steady,
                const TicketPtr& t);
  std::shared_ptr<Installed> View(int64_t step_id, const std::string& dest);
  int64_t TurnOf(const std::string& dest, int64_t step, double steady);  // a round
  void Supersede(const std::string& dest, int64_t step_id, Runs* runs);
  void Whole(Channel* ch);  // what ch served counts for an install's restriction
  void HandBackNow(Channel* ch, const TicketPtr& t, Runs* runs);
  void HandBackFront(Channel* ch, Runs* runs);  // the first of ch's waiters, now
  void Skip(Channel* ch, const std::string& name, const char* reason);
  void Pump(Channel* ch, Runs* runs);
  void Arm(Channel* ch);
  void OnStall(Channel* ch, Runs* runs);
  double Backlog(double steady_now);  // drains the virtual queue to now; its bytes
  bool Paced();                       // the backlog holds the next transfer back
  void OnPace(Runs* runs);
  bool Pacing() const { return opt_.pace_rate > 0; }
  // Hands back, while the link has room, gate-wide; the channels it served go to
  // `served` where given.
  void ServePaced(Runs* runs, std::vector<Channel*>* served = nullptr);
  Channel* Conserve(Runs* runs);      // out of turn when the link idles (see above)
  // Finishes ch: what it still holds goes now, each marked `early` (nullptr: it
  // finished by itself, nothing held), and its record joins the history.
  void Finish(Channel* ch, Runs* runs, const char* early);
  void Sweep(double steady_now, bool force, Runs* runs);  // finishes quiet channels
  void Retire(int64_t step_id);  // forgets a step whose channels all finished
  // Keeps the paced service's indexes (eligible_, behind_) in step with ch's waiters
  // and counter: called whenever either changes.
  void Index(Channel* ch);
  void Account(int64_t nbytes);  // a hand-back's bytes join the pacing backlog
  void Disarm(Channel* ch);
  std::string SummaryLocked();
  std::string StatsLocked(bool include_active, int64_t since, Runs* runs);
  void TimerLoop();
  static void RunAll(Runs* runs);

  Options opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread timer_;
  std::shared_ptr<Installed> installed_;
  int64_t next_version_ = 1;
  int64_t next_seq_ = 0;
  // Active steps, oldest first: step id -> destination -> channel.
  std::deque<int64_t> step_order_;
  std::unordered_map<int64_t, int64_t> step_seq_;  // active step -> arrival number
  int64_t next_step_seq_ = 0;
  std::unordered_map<int64_t, std::map<std::string, std::unique_ptr<Channel>>> steps_;
  std::unordered_map<int64_t, std::shared_ptr<Installed>> binding_;
  // Finished (step, worker) records, as JSON, with their seq; oldest first.
  std::deque<std::pair<int64_t, std::string>> history_;
  int64_t last_record_seq_ = 0;                           // seq of the newest record
  std::unordered_map<std::string, int64_t> dest_records_;  // destination -> worker_seq
  std::unordered_set<std::string> served_;
  std::unordered_map<std::string, std::unordered_set<std::string>> served_by_dest_;
  // What whole steps served, overall and per destination: an install restricts a
  // destination's order to what it was served (served_) only once it has one.
  std::unordered_set<std::string> whole_;
  std::unordered_map<std::string, std::unordered_set<std::string>> whole_by_dest_;
  std::unordered_map<std::string, std::unordered_set<std::string>> served_at_install_;
  std::map<std::pair<int64_t, std::string>, std::shared_ptr<Installed>> views_;
  std::unordered_map<std::string, int> absent_streak_;  // destination + "\n" + name
  // The channels with waiters, indexed so that the paced service's pick is the first
  // entry (O(log n) a hand-back, n the waiting channels; no walk over the workers):
  // eligible_, those whose front waiter's turn came, by (turn, its counter when aligned
  // else 0, task, step seq, destination): what ServePaced hands back next; behind_,
  // all of them, by (turn, front priority - counter, task, step seq, destination):
  // what Conserve lets go out of turn. And the channels with a skip timer, by deadline.
  std::map<PaceKey, Channel*> eligible_, behind_;
  std::set<std::pair<double, Channel*>> armed_;  // (ch->deadline, ch); deadline 0: not in
  // A job's current round (TurnOf): its turn and its channels in the order they
  // opened, as (destination, the gate's step key: a retired step is no longer served),
  // and the destinations among them.
  struct Round {
    int64_t turn = -1;  // < 0: no round yet
    std::vector<std::pair<std::string, int64_t>> members;
    std::unordered_set<std::string> dests;
  };
  std::unordered_map<std::string, Round> rounds_;        // job -> its current round
  std::unordered_map<std::string, int64_t> dest_turns_;  // destination -> its last turn
  // destination -> (steady time, request step id, gate step key) of its newest channel
  struct Opened {
    double at;
    int64_t step_id, key;
  };
  std::unordered_map<std::string, Opened> dest_opened_;
  std::string instance_;  // new in every gate: a restarted PS answers with another
  // Finished (step, destination) channels, for a request that comes after its channel
  // finished: (steady time, key) oldest first, and the keys.
  std::deque<std::pair<double, std::string>> finished_order_;
  std::unordered_set<std::string> finished_;
  double last_sweep_ = 0;
  std::map<std::string, int64_t> totals_;
  double backlog_bytes_ = 0, backlog_time_ = 0;  // the virtual queue (steady clock)
  double pace_deadline_ = 0;                     // steady; 0: nothing held by pacing
  double drain_at_ = 0;                          // steady: when the virtual queue empties
  void WakeAt(double steady_when);               // the timer runs OnPace then
  std::atomic<bool> bypass_{false};
};

}  // namespace tictac

#endif  // TICTAC_ENFORCE_NATIVE_GATE_H_
