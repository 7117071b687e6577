// Stage timers for the benchmarks: the CPU time of each stage of encode_batch, compiled in only
// in a bench build (-DFASTBERT_STAGE_TIMES: FASTBERT_STAGE_TIMES=1 pip install ...; the tokenizer
// bench's --scaling reads them). Elsewhere every mark is a no-op and the times stay empty.
// CPU time, not wall time, so that a loaded machine does not change the figures: a GIL stage
// counts the calling thread's CPU time, a stage without the GIL the whole process's (every thread
// of the pool). Lists built chunk by chunk while the pool encodes count in "encode".
#pragma once
#include <time.h>

#include <array>

namespace fastbert {

#ifdef FASTBERT_STAGE_TIMES
constexpr bool kStageTimes = true;
#else
constexpr bool kStageTimes = false;
#endif
enum Stage : int { kInputs, kEncode, kLayout, kOutputGil, kOutputThreads, kExtras, kStages };
inline const char* const kStageNames[kStages] = {"inputs", "encode", "layout", "output", "output_threads", "extras"};
inline constexpr bool kStageHoldsGil[kStages] = {true, false, true, true, false, true};
using StageTimes = std::array<double, kStages>;  // nanoseconds per stage

// One call's clock: mark(s) adds the CPU time since the last mark to stage s of `ns`.
class StageClock {
 public:
    explicit StageClock(StageTimes& ns) : ns_(ns) {}
    void mark(int s) {
        if (!kStageTimes) return;
        const double t = now(CLOCK_THREAD_CPUTIME_ID), p = now(CLOCK_PROCESS_CPUTIME_ID);
        ns_[s] += kStageHoldsGil[s] ? t - thread_ : p - process_;
        thread_ = t;
        process_ = p;
    }

 private:
    static double now(clockid_t id) {
        timespec t{};
        clock_gettime(id, &t);
        return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
    }
    StageTimes& ns_;
    double thread_ = kStageTimes ? now(CLOCK_THREAD_CPUTIME_ID) : 0;
    double process_ = kStageTimes ? now(CLOCK_PROCESS_CPUTIME_ID) : 0;
};

}  // namespace fastbert
