#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
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

void ThreadPool::drain() {
    // Takes tasks until none is left; counts the ones this thread finished.
    size_t mine = 0;
    for (;;) {
        const size_t i = next_.fetch_add(1);
        if (i >= n_tasks_) break;
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
        }
        ++mine;
    }
    if (mine) {
        std::lock_guard<std::mutex> lock(mu_);
        finished_ += mine;
        if (finished_ == n_tasks_) done_.notify_all();
    }
}

void ThreadPool::worker_loop() {
    size_t seen = 0;
    for (;;) {
        spin_until([&] { return stop_.load() || generation_.load() != seen; }, kIdleSpin);
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            ++active_;
        }
        drain();
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--active_ == 0) done_.notify_all();
        }
    }
}

void ThreadPool::run(size_t n_tasks, const std::function<void(size_t)>& fn) {
    if (n_tasks == 0) return;
    {
        // No worker may still be inside drain() of the previous batch while the counters reset,
        // or it could take a task index twice.
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return active_ == 0; });
        fn_ = &fn;
        n_tasks_ = n_tasks;
        next_.store(0);
        finished_ = 0;
        error_ = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    drain();
    auto all_done = [&] { return finished_.load() == n_tasks && active_.load() == 0; };
    spin_until(all_done, kJoinSpin);
    std::exception_ptr err;
    {
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, all_done);
        err = error_;
        fn_ = nullptr;
    }
    if (err) std::rethrow_exception(err);
}

}  // namespace fastbert
