// A small fork-aware thread pool for batch encoding: run(n, fn) calls fn(0..n-1) on the workers
// and the calling thread, and returns when all are done (rethrowing the first exception).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastbert {

class ThreadPool {
 public:
    explicit ThreadPool(int num_threads);  // num_threads - 1 workers; the caller is the last one
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    void run(size_t n_tasks, const std::function<void(size_t)>& fn);
    int size() const { return static_cast<int>(workers_.size()) + 1; }

 private:
    void worker_loop();
    void drain();
    void stop();  // ends and joins the workers

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)>* fn_ = nullptr;
    size_t n_tasks_ = 0;
    std::atomic<size_t> next_{0};
    size_t finished_ = 0;
    int active_ = 0;  // workers inside drain(); a batch is set up only when none is
    size_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace fastbert
