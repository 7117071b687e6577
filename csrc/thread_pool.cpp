#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace fastbert {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

// Spins until done() or the time is up; true when done(). It yields the core now and then, so
// that on a machine with more busy threads than cores (torch's own, another pool) the thread it
// waits for, or any other, can run.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (unsigned i = 1;; ++i) {
        if (done()) return true;
        if (i % 64 == 0) {
            if (std::chrono::steady_clock::now() > end) return false;
            std::this_thread::yield();
        }
        cpu_relax();
    }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
    try {
        for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
        // the system refused a thread: the started ones must be joined, or their destructors terminate
        stop();
        throw;
    }
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
}

void ThreadPool::run_task(size_t i, bool worker) {
    // after a failure the batch is lost anyway: the remaining tasks are only counted
    if (!failed_.load(std::memory_order_relaxed)) {
        const auto start = std::chrono::steady_clock::now();
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
            failed_ = true;
        }
        const auto busy = std::chrono::steady_clock::now() - start;
        (worker ? worker_busy_ns_ : caller_busy_ns_)
            .fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(busy).count(), std::memory_order_relaxed);
    }
    task_done_[i].store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mu_);
    if (++finished_ == n_tasks_) done_.notify_all();
}

void ThreadPool::drain(bool worker) {
    for (;;) {
        const size_t i = next_.fetch_add(1);
        if (i >= n_tasks_) return;
        if (worker && worker_tasks_.fetch_add(1, std::memory_order_relaxed) == 0) {
            const auto waited = std::chrono::steady_clock::now() - started_;
            worker_start_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
                                   std::memory_order_relaxed);
        }
        run_task(i, worker);
    }
}

int ThreadPool::place_workers() {
#if defined(__linux__)
    // The workers may run where the caller may, except on the caller's own core while there is
    // another. On the 2-core guest of bench/results/tokenizer-worker-placement-20261203 (made by
    // bench_tokenizer.py --quick --idle-gaps), after the machine idled 10-100 ms a worker started
    // 2.1 ms late (median) and two threads ran a batch 0.98x as fast as one; kept off the caller's
    // core, it started at once and two threads ran 1.52x as fast. The caller's cores are read for
    // every batch (a syscall, against milliseconds of batch) so that a changed affinity (taskset,
    // os.sched_setaffinity) is followed; the workers' are set only when that changes them.
    const int cpu = sched_getcpu();
    cpu_set_t allowed;
    if (cpu < 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    cpu_set_t others = allowed;
    CPU_CLR(cpu, &others);
    const cpu_set_t& mask = CPU_COUNT(&others) ? others : allowed;
    if (!CPU_EQUAL(&mask, &worker_cpus_)) {
        // a refusal leaves that worker where it was: slower on such a machine, never wrong
        for (std::thread& t : workers_) pthread_setaffinity_np(t.native_handle(), sizeof mask, &mask);
        worker_cpus_ = mask;
    }
    return cpu;
#else
    return -1;
#endif
}

ThreadPool::LastRun ThreadPool::last_run() const {
    // the workers wrote before they counted their tasks finished, under mu_, which run() waited for
    const int64_t start_ns = worker_start_ns_.load(std::memory_order_relaxed);
    return LastRun{runs_, n_tasks_, worker_tasks_.load(std::memory_order_relaxed),
                   start_ns < 0 ? -1.0 : static_cast<double>(start_ns) * 1e-3, caller_cpu_,
                   static_cast<double>(run_ns_) * 1e-3,
                   static_cast<double>(caller_busy_ns_.load(std::memory_order_relaxed)) * 1e-3,
                   static_cast<double>(worker_busy_ns_.load(std::memory_order_relaxed)) * 1e-3};
}

void ThreadPool::consume_in_order(const std::function<void(size_t)>& consume) {
    for (size_t next = 0; next < n_tasks_ && !failed_.load();) {
        if (task_done_[next].load(std::memory_order_acquire)) {
            // a task that threw set failed_ before its done flag: its output is never consumed
            if (failed_.load()) break;
            consume(next++);
            continue;
        }
        const size_t i = next_.fetch_add(1);
        if (i < n_tasks_) {
            run_task(i, false);
            continue;
        }
        // every task is taken and task `next` runs on a worker: wait for it, then for a while
        // in short sleeps (a task takes up to a few milliseconds)
        const auto ready = [&] { return task_done_[next].load(std::memory_order_acquire) || failed_.load(); };
        while (!spin_until(ready, kJoinSpin)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

void ThreadPool::wake() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        place_workers();
        ++wakes_;
    }
    wake_.notify_all();
}

void ThreadPool::worker_loop() {
    size_t seen = 0, wakes_seen = 0;
    std::chrono::microseconds spin = kIdleSpin;
    for (;;) {
        spin_until([&] { return stop_.load() || generation_.load() != seen; }, spin);
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen || wakes_ != wakes_seen; });
            if (stop_) return;
            wakes_seen = wakes_;
            if (generation_ == seen) {  // woken ahead of a batch: wait for it spinning
                spin = kWakeSpin;
                continue;
            }
            seen = generation_;
            ++active_;
        }
        spin = kIdleSpin;
        drain(true);
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--active_ == 0) done_.notify_all();
        }
    }
}

void ThreadPool::run(size_t n_tasks, const std::function<void(size_t)>& fn,
                     const std::function<void(size_t)>* consume) {
    if (n_tasks == 0) return;
    {
        // No worker may still be inside drain() of the previous batch while the counters reset,
        // or it could take a task index twice.
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return active_ == 0; });
        fn_ = &fn;
        n_tasks_ = n_tasks;
        task_done_.reset(new std::atomic<bool>[n_tasks]);
        for (size_t i = 0; i < n_tasks; ++i) task_done_[i].store(false, std::memory_order_relaxed);
        next_.store(0);
        finished_ = 0;
        failed_ = false;
        error_ = nullptr;
        ++runs_;
        worker_tasks_.store(0, std::memory_order_relaxed);
        worker_start_ns_.store(-1, std::memory_order_relaxed);
        caller_busy_ns_.store(0, std::memory_order_relaxed);
        worker_busy_ns_.store(0, std::memory_order_relaxed);
        caller_cpu_ = place_workers();
        started_ = std::chrono::steady_clock::now();
        ++generation_;
    }
    wake_.notify_all();
    auto all_done = [&] { return finished_.load() == n_tasks && active_.load() == 0; };
    auto join = [&] {
        drain(false);  // what no one has taken yet (nothing, unless the consumer stopped early)
        spin_until(all_done, kJoinSpin);
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, all_done);
        fn_ = nullptr;
        return error_;
    };
    if (consume) {
        try {
            consume_in_order(*consume);
        } catch (...) {
            // the workers still use this batch's tasks: they must end before the caller's frame
            // goes (also when the interpreter ends the thread by unwinding it)
            join();
            throw;
        }
    }
    const std::exception_ptr err = join();
    run_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started_).count();
    if (err) std::rethrow_exception(err);
}

}  // namespace fastbert
