// The gate's pacing (gate.h, "Pacing"): the virtual queue of the bytes handed back,
// drained at the link's rate; the paced service that picks which waiting transfer goes
// while the link has room; work conservation; and the timer thread (skip bounds, pacing
// wake-ups, sweeps).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <tuple>
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

bool Gate::Conserve(Runs* runs) {
  if (opt_.conserve_after_s < 0) return false;
  Channel* pick = nullptr;
  for (const auto& [at, ch] : waiting_) {  // earliest turn first
    if (pick != nullptr && ch->turn > pick->turn) break;
    if (pick == nullptr || ch->waiters.front()->priority - ch->counter <
                               pick->waiters.front()->priority - pick->counter)
      pick = ch;
  }
  if (pick == nullptr) return false;
  const double when =
      std::max(drain_at_, pick->waiters.front()->t_wait) + opt_.conserve_after_s;
  if (SteadyNow() < when) {
    WakeAt(when);
    return false;
  }
  totals_["out_of_turn"] += 1;
  HandBackFront(pick, runs);
  return true;
}

void Gate::ServePaced(Runs* runs) {
  while (!Paced()) {
    // The earliest turn with a transfer whose turn came; within it, aligned: the
    // destination furthest behind, else the lowest task (waiting_ is ordered by
    // (turn, task, step seq, destination)).
    Channel* best = nullptr;
    for (const auto& [at, ch] : waiting_) {
      if (best != nullptr && ch->turn > best->turn) break;
      if (ch->waiters.front()->priority > ch->counter) continue;
      if (best == nullptr || (opt_.align && ch->counter < best->counter)) best = ch;
    }
    if (best == nullptr) {
      if (Conserve(runs)) continue;
      return;
    }
    HandBackFront(best, runs);
  }
}

void Gate::OnPace(Runs* runs) {
  pace_deadline_ = 0;
  if (Pacing()) ServePaced(runs);
  std::vector<Channel*> waiting;
  for (const auto& [at, ch] : waiting_) waiting.push_back(ch);
  for (Channel* ch : waiting)
    if (!ch->waiters.empty()) Pump(ch, runs);
}

void Gate::Waiting(Channel* ch) {
  const auto at = std::make_tuple(ch->turn, ch->task, ch->step_seq, ch->dest);
  if (ch->waiters.empty()) waiting_.erase(at);
  else waiting_.emplace(at, ch);
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
    for (Channel* ch : armed_)
      if (next == 0 || ch->deadline < next) next = ch->deadline;
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
    std::vector<Channel*> due;
    for (Channel* ch : armed_)
      if (ch->deadline <= now) due.push_back(ch);
    for (Channel* ch : due)
      if (armed_.count(ch) && ch->deadline != 0 && ch->deadline <= now) OnStall(ch, &runs);
    Sweep(now, false, &runs);
    l.unlock();
    RunAll(&runs);
    l.lock();
  }
}

}  // namespace tictac
