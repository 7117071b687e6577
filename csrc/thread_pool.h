// A small fork-aware thread pool for batch encoding: run(n, fn) calls fn(0..n-1) on the workers
// and the calling thread, and returns when all are done (rethrowing the first exception). With a
// consumer, the calling thread also calls consume(i) for each i in order, as soon as fn(0..i) are
// done, and runs tasks itself only while the next one to consume is still running: the serial
// step that follows each task (building Python lists under the GIL) overlaps the later tasks.
//
// A batch of new text takes a few milliseconds, in two or three parallel steps back to back, and
// waking a sleeping thread costs tens of microseconds on a virtual machine. So the caller, once
// out of tasks, spins (bounded) until the last task ends, and an idle worker spins for
// kIdleSpin before it sleeps, in time for the next step of the same call. wake() starts sleeping
// workers ahead of a batch (while the caller still reads its inputs); they spin for up to
// kWakeSpin waiting for it, then sleep again.
//
// On Linux the workers are kept off the caller's core (see place_workers): a scheduler that packs
// woken threads onto busy cores (as a virtual machine's guest kernel may, to leave idle vCPUs
// halted) otherwise queues a worker woken after an idle spell behind the caller on the caller's
// core, and the two take turns there instead of running side by side.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif

namespace fastbert {

class ThreadPool {
 public:
    static constexpr std::chrono::microseconds kIdleSpin{100}, kJoinSpin{500}, kWakeSpin{1000};

    explicit ThreadPool(int num_threads);  // num_threads - 1 workers; the caller is the last one
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    void run(size_t n_tasks, const std::function<void(size_t)>& fn,
             const std::function<void(size_t)>* consume = nullptr);
    void wake();  // a batch is about to come: sleeping workers start spinning for it
    int size() const { return static_cast<int>(workers_.size()) + 1; }

    // What the workers did in the last run(), read after it returned: how many of its tasks they
    // ran, and how long after run() began the first of them started one (-1: none did; the caller
    // ran them all). On a virtual machine a worker whose core idled can start milliseconds late.
    // And how long the run took, and the time spent inside tasks by the caller and by the workers
    // (the same instructions as on one thread: a sum above one thread's time is the threads running
    // them slower, a sum below twice run_us is a thread waiting).
    struct LastRun {
        size_t runs = 0;  // run() calls so far, to tell a new record from an old one
        size_t tasks = 0, worker_tasks = 0;
        double worker_start_us = -1;
        int caller_cpu = -1;  // the core the caller ran on when the batch began (-1: not known)
        double run_us = 0, caller_busy_us = 0, worker_busy_us = 0;
    };
    LastRun last_run() const;

 private:
    void worker_loop();
    void run_task(size_t i, bool worker);
    void drain(bool worker);  // takes tasks until none is left; worker: called by a worker
    void consume_in_order(const std::function<void(size_t)>& consume);
    void stop();  // ends and joins the workers
    // Under mu_: lets the workers run on the caller's cores but its own; returns the caller's core
    // (-1: not known).
    int place_workers();

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)>* fn_ = nullptr;
    size_t n_tasks_ = 0;
    std::atomic<size_t> next_{0};
    // Written under mu_ (so that the condition variables miss no change), read by the spins without it.
    std::atomic<size_t> finished_{0};
    std::atomic<int> active_{0};  // workers inside drain(); a batch is set up only when none is
    std::unique_ptr<std::atomic<bool>[]> task_done_;  // per task of this batch (consumers wait on it)
    std::atomic<bool> failed_{false};                 // a task threw: the rest are skipped
    std::atomic<size_t> generation_{0};
    size_t wakes_ = 0;  // under mu_: calls of wake()
    std::atomic<bool> stop_{false};
    // the last run's record (LastRun): set up with the batch, written by the workers' first tasks
    size_t runs_ = 0;
    std::chrono::steady_clock::time_point started_;
    std::atomic<size_t> worker_tasks_{0};
    std::atomic<int64_t> worker_start_ns_{-1};
    std::atomic<int64_t> caller_busy_ns_{0}, worker_busy_ns_{0};
    int64_t run_ns_ = 0;
    int caller_cpu_ = -1;  // under mu_: the caller's core when the last batch began (-1: not known)
#if defined(__linux__)
    cpu_set_t worker_cpus_{};  // under mu_: the cores the workers were last given (none: never set)
#endif
    std::exception_ptr error_;
};

}  // namespace fastbert
