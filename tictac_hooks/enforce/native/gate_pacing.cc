// The gate's pacing (gate.h, "Pacing"): the virtual queue of the bytes handed back,
// drained at the link's rate; the paced service that picks which waiting transfer goes
// while the link has room; work conservation; and the timer thread (skip bounds, pacing
// wake-ups, sweeps).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "gate.h"
#include "gate_internal.h"

namespace tictac {

double Gate::Backlog(double steady_now) {
  if (backlog_time_ > 0 && opt_.pace_rate > 0)
    backlog_bytes_ = std::max(0.0, backlog_bytes_ - opt_.pace_rate * (steady_now - backlog_time_));
  backlog_time_ = steady_now;
  return backlog_bytes_;
}

bool Gate::Paced() {
  if (opt_.pace_rate <= 0) return false;
  const double now = SteadyNow();
  const double over = Backlog(now) - static_cast<double>(opt_.pace_window);
  if (over <= 0) return false;
  WakeAt(now + over / opt_.pace_rate);
  return true;
}

void Gate::WakeAt(double steady_when) {
  if (pace_deadline_ == 0 || steady_when < pace_deadline_) {
    pace_deadline_ = steady_when;
    cv_.notify_all();
  }
}

Channel* Gate::Conserve(Runs* runs) {
  if (opt_.conserve_after_s < 0 || behind_.empty()) return nullptr;
  // The earliest turn's channel whose front waiter is the fewest transfers behind.
  Channel* pick = behind_.begin()->second;
  const double when =
      std::max(drain_at_, pick->waiters.front()->t_wait) + opt_.conserve_after_s;
  if (SteadyNow() < when) {
    WakeAt(when);
    return nullptr;
  }
  totals_["out_of_turn"] += 1;
  HandBackFront(pick, runs);
  return pick;
}

void Gate::ServePaced(Runs* runs, std::vector<Channel*>* served) {
  while (!Paced()) {
    // The earliest turn with a transfer whose turn came; within it, aligned: the
    // destination furthest behind, else the lowest task (eligible_'s order).
    Channel* best = nullptr;
    if (!eligible_.empty()) {
      best = eligible_.begin()->second;
      HandBackFront(best, runs);
    } else {
      best = Conserve(runs);
      if (best == nullptr) return;
    }
    if (served != nullptr) served->push_back(best);
  }
}

void Gate::OnPace(Runs* runs) {
  pace_deadline_ = 0;
  std::vector<Channel*> pump;
  if (Pacing()) {
    ServePaced(runs, &pump);  // what it served gets its channel's bookkeeping (Pump)
  } else {  // pacing was switched off: every waiting channel goes by its own counter
    for (const auto& [at, ch] : behind_) pump.push_back(ch);
    std::sort(pump.begin(), pump.end(), [](const Channel* a, const Channel* b) {
      return std::tie(a->turn, a->task, a->step_seq, a->dest) <
             std::tie(b->turn, b->task, b->step_seq, b->dest);
    });
  }
  std::unordered_set<Channel*> pumped;
  for (Channel* ch : pump)
    if (pumped.insert(ch).second && !ch->waiters.empty()) Pump(ch, runs);
}

void Gate::Index(Channel* ch) {
  if (ch->eligible_at) eligible_.erase(*ch->eligible_at);
  if (ch->behind_at) behind_.erase(*ch->behind_at);
  ch->eligible_at.reset();
  ch->behind_at.reset();
  if (ch->waiters.empty()) return;
  const int64_t behind = ch->waiters.front()->priority - ch->counter;
  ch->behind_at.emplace(ch->turn, behind, ch->task, ch->step_seq, ch->dest);
  behind_.emplace(*ch->behind_at, ch);
  if (behind <= 0) {  // its turn came (Eq. of the counter: priority <= counter)
    ch->eligible_at.emplace(ch->turn, opt_.align ? ch->counter : 0, ch->task,
                            ch->step_seq, ch->dest);
    eligible_.emplace(*ch->eligible_at, ch);
  }
}

void Gate::Account(int64_t nbytes) {
  if (opt_.pace_rate > 0) {
    const double now = SteadyNow();
    backlog_bytes_ = Backlog(now) + nbytes;
    drain_at_ = now + backlog_bytes_ / opt_.pace_rate;
  }
}

void Gate::TimerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    double next = pace_deadline_;
    if (!armed_.empty() && (next == 0 || armed_.begin()->first < next))
      next = armed_.begin()->first;
    if (!step_order_.empty()) {  // quiet channels finish without waiting for a read
      const double sweep = last_sweep_ + opt_.finish_after_s / 4;
      if (next == 0 || sweep < next) next = sweep;
    }
    if (next == 0) {
      cv_.wait(l);
      continue;
    }
    double now = SteadyNow();
    if (next > now) {
      cv_.wait_for(l, std::chrono::duration<double>(next - now));
      continue;
    }
    Runs runs;
    if (pace_deadline_ != 0 && pace_deadline_ <= now) OnPace(&runs);
    // Earliest deadline first; OnStall disarms the channel and re-arms it, if at all,
    // skip_after_s (> 0) from now, so this ends.
    while (!armed_.empty() && armed_.begin()->first <= now)
      OnStall(armed_.begin()->second, &runs);
    Sweep(now, false, &runs);
    l.unlock();
    RunAll(&runs);
    l.lock();
  }
}

}  // namespace tictac
