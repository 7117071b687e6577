// The only file that includes pybind11: module fastbert._C. Binds EncodeOptions and the
// tokenizer: converts Python inputs to UTF-8 views (with the GIL), runs the batch without the
// GIL, and hands the rows to output_layout (numpy buffers, packed or padded) or py_lists (lists).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <time.h>

#ifdef __GLIBCXX__
#include <cxxabi.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "encode_options.h"
#include "output_layout.h"
#include "py_lists.h"
#include "tokenizer.h"

namespace py = pybind11;
using namespace fastbert;

namespace {

// Takes the GIL back. During interpreter exit, Python 3.11-3.13 end a daemon thread that asks for
// it with pthread_exit, a forced unwind. Unwinding the call would release its Python objects (the
// lists built so far, the output dict) without the GIL while the main thread tears the interpreter
// down, and crash the process. Such a thread is parked instead until the process ends (Python 3.14
// parks daemon threads itself).
void take_gil(PyThreadState* state) {
#ifdef __GLIBCXX__
    try {
        PyEval_RestoreThread(state);
    } catch (abi::__forced_unwind&) {
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
#else
    PyEval_RestoreThread(state);
#endif
}

// Runs f with the GIL released. Deliberately not py::gil_scoped_release, whose destructor takes the
// GIL back without take_gil.
template <class F>
void without_gil(F&& f) {
    PyThreadState* state = PyEval_SaveThread();
    std::exception_ptr error;
    try {
        f();
#ifdef __GLIBCXX__
    } catch (abi::__forced_unwind&) {
        throw;  // a forced unwind must go on (catch (...) below would swallow it and abort)
#endif
    } catch (...) {
        error = std::current_exception();
    }
    take_gil(state);
    if (error) std::rethrow_exception(error);
}

// Stage timers for measuring the serial (GIL-held) part of encode_batch: compiled in only with
// -DFASTBERT_STAGE_TIMES (bench/bench_tokenizer.py --scaling reads them); otherwise no-ops.
// CPU time, not wall time, so that a loaded machine does not change the figures: a GIL stage
// counts the calling thread's CPU time, a stage without the GIL the whole process's (every thread
// of the pool). Lists built chunk by chunk while the pool encodes count in "encode".
#ifdef FASTBERT_STAGE_TIMES
constexpr bool kStageTimes = true;
#else
constexpr bool kStageTimes = false;
#endif
enum Stage : int { kInputs, kEncode, kLayout, kOutputGil, kOutputThreads, kExtras, kStages };
const char* const kStageNames[kStages] = {"inputs", "encode", "layout", "output", "output_threads", "extras"};
constexpr bool kStageHoldsGil[kStages] = {true, false, true, true, false, true};
struct StageClock {
    static double now(clockid_t id) {
        timespec t{};
        clock_gettime(id, &t);
        return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
    }
    double thread = kStageTimes ? now(CLOCK_THREAD_CPUTIME_ID) : 0;
    double process = kStageTimes ? now(CLOCK_PROCESS_CPUTIME_ID) : 0;
    // adds the CPU time since the last mark to stage s
    void mark(std::array<double, kStages>& ns, int s) {
        if (!kStageTimes) return;
        const double t = now(CLOCK_THREAD_CPUTIME_ID), p = now(CLOCK_PROCESS_CPUTIME_ID);
        ns[s] += kStageHoldsGil[s] ? t - thread : p - process;
        thread = t;
        process = p;
    }
};

// Pauses Python's cyclic GC while it lives (restored also when an exception leaves the scope).
struct GcPause {
#if PY_VERSION_HEX >= 0x030A0000
    const int was_enabled = PyGC_Disable();
    ~GcPause() {
        if (was_enabled) PyGC_Enable();
    }
#endif
};

// Output buffers handed back to the tokenizer when their numpy arrays die, so the next batch
// writes into memory whose pages are already mapped: fresh multi-MB arrays cost more in page
// faults and kernel zeroing than the tokenization that fills them. Holds at most kMaxBytes.
class BufferPool {
 public:
    static constexpr size_t kMaxBytes = size_t{64} << 20;
    void* get(size_t n) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            size_t best = free_.size();
            for (size_t i = 0; i < free_.size(); ++i)
                if (free_[i].second >= n && free_[i].second <= 2 * n + 4096 &&
                    (best == free_.size() || free_[i].second < free_[best].second))
                    best = i;
            if (best < free_.size()) {
                void* p = free_[best].first;
                held_ -= free_[best].second;
                free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
                return p;
            }
        }
        void* p = std::malloc(n ? n : 1);
        if (!p) throw std::bad_alloc();
        return p;
    }
    void put(void* p, size_t n) {
        std::lock_guard<std::mutex> lock(mu_);
        if (n < (size_t{1} << 16) || held_ + n > kMaxBytes) {
            std::free(p);
            return;
        }
        free_.emplace_back(p, n);
        held_ += n;
    }
    ~BufferPool() {
        for (auto& f : free_) std::free(f.first);
    }

 private:
    std::mutex mu_;
    std::vector<std::pair<void*, size_t>> free_;
    size_t held_ = 0;
};

// An int64 numpy array whose memory comes from (and returns to) the pool.
py::array_t<int64_t> pooled_array(const std::shared_ptr<BufferPool>& pool, const std::vector<py::ssize_t>& shape) {
    size_t count = 1;
    for (py::ssize_t d : shape) count *= static_cast<size_t>(d);
    const size_t bytes = count * sizeof(int64_t);
    struct Holder {
        std::shared_ptr<BufferPool> pool;
        void* data;
        size_t bytes;
    };
    auto* h = new Holder{pool, pool->get(bytes), bytes};
    py::capsule owner(h, [](void* p) {
        auto* holder = static_cast<Holder*>(p);
        holder->pool->put(holder->data, holder->bytes);
        delete holder;
    });
    return py::array_t<int64_t>(shape, static_cast<int64_t*>(h->data), owner);
}

// A str of a batch whose UTF-8 bytes are made without the GIL: segment seg of the batch, and what
// names it in an error (a text or a text_pair, its item and word). A batch's pending strs are in
// input order, texts first.
struct PendingText {
    PyObject* text;
    size_t seg, chars;
    bool pair;
    size_t index;
    long word;
};

// The UTF-8 form of a str's characters (PyUnicode kind 1, 2 or 4), into out;
// false at a surrogate code point, which UTF-8 cannot hold (Python's encoder raises there).
// One loop per kind (no kind switch per character), ASCII copied a word at a time.
template <class Unit>
bool encode_utf8_units(const Unit* s, size_t n, std::string& out) {
    out.resize(n * (sizeof(Unit) == 1 ? 2 : sizeof(Unit) == 2 ? 3 : 4));
    char* w = &out[0];
    constexpr size_t kPerWord = 8 / sizeof(Unit);
    constexpr uint64_t kNotAscii = sizeof(Unit) == 1   ? 0x8080808080808080ull
                                   : sizeof(Unit) == 2 ? 0xFF80FF80FF80FF80ull
                                                       : 0xFFFFFF80FFFFFF80ull;
    size_t i = 0;
    while (i < n) {
        if (i + kPerWord <= n) {
            uint64_t word;
            std::memcpy(&word, s + i, 8);
            if (!(word & kNotAscii)) {
                for (size_t k = 0; k < kPerWord; ++k) w[k] = static_cast<char>(s[i + k]);
                w += kPerWord;
                i += kPerWord;
                continue;
            }
        }
        const uint32_t c = s[i++];
        if (c < 0x80) {
            *w++ = static_cast<char>(c);
        } else if (c < 0x800) {
            *w++ = static_cast<char>(0xC0 | (c >> 6));
            *w++ = static_cast<char>(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c < 0xE000) return false;
            *w++ = static_cast<char>(0xE0 | (c >> 12));
            *w++ = static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            *w++ = static_cast<char>(0x80 | (c & 0x3F));
        } else {
            *w++ = static_cast<char>(0xF0 | (c >> 18));
            *w++ = static_cast<char>(0x80 | ((c >> 12) & 0x3F));
            *w++ = static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            *w++ = static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    out.resize(static_cast<size_t>(w - out.data()));
    return true;
}

bool encode_utf8(int kind, const void* data, size_t n, std::string& out) {
    switch (kind) {
        case PyUnicode_1BYTE_KIND: return encode_utf8_units(static_cast<const Py_UCS1*>(data), n, out);
        case PyUnicode_2BYTE_KIND: return encode_utf8_units(static_cast<const Py_UCS2*>(data), n, out);
        default: return encode_utf8_units(static_cast<const Py_UCS4*>(data), n, out);
    }
}

// A Python-owned tokenizer: the C++ tokenizer plus cached Python ints for building lists.
class PyTokenizer {
 public:

 private:
    struct Workspace;  // per-thread buffers of encode_batch (below)

 public:
    PyTokenizer(py::object vocab, bool lowercase, bool strip_accents, bool handle_chinese_chars, bool clean_text,
                const std::string& unk_token, const std::string& prefix, size_t max_chars,
                const std::vector<std::tuple<std::string, bool, bool, bool, bool, bool>>& added) {
        Vocab v;
        if (py::isinstance<py::str>(vocab)) {
            try {
                v = Vocab::from_file(vocab.cast<std::string>());
            } catch (const std::invalid_argument& e) {
                throw py::value_error(e.what());
            } catch (const std::runtime_error& e) {
                PyErr_SetFromErrnoWithFilename(PyExc_OSError, vocab.cast<std::string>().c_str());
                throw py::error_already_set();
            }
        } else {
            v = Vocab(vocab.cast<std::vector<std::string>>());
        }
        TokenizerConfig cfg;
        cfg.normalizer = NormalizerConfig{clean_text, handle_chinese_chars, strip_accents, lowercase};
        cfg.unk_token = unk_token;
        cfg.continuing_subword_prefix = prefix;
        cfg.max_input_chars_per_word = max_chars;
        std::vector<AddedToken> toks;
        for (const auto& a : added) {
            AddedToken t;
            t.content = std::get<0>(a);
            t.lstrip = std::get<1>(a);
            t.rstrip = std::get<2>(a);
            t.single_word = std::get<3>(a);
            t.normalized = std::get<4>(a);
            t.special = std::get<5>(a);
            t.id = v.id(t.content);
            toks.push_back(t);
        }
        base_size_ = v.distinct();
        base_ids_ = v.size();
        try {
            tok_.reset(new Tokenizer(std::move(v), cfg, std::move(toks)));
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
        try {
            ints_.reset(new IntTable(std::max<size_t>(tok_->vocab().size(), 65536)));
        } catch (const PythonError&) {
            throw py::error_already_set();
        }
    }

    // (out, widest row): the outputs as a dict, and the longest row's length (the long-sequence notice).
    py::tuple encode_batch(py::object texts, py::object pairs, const EncodeOptions& o) {
        StageClock clock;
        // This thread's input and row buffers, reused from its last batch (about 20 allocations
        // less per call: most of the C++ cost of one short text); a fresh set if they are in use
        // (a call made again from inside this one, by a finalizer the GC ran).
        Workspace own;
        Workspace& ws = workspace_.busy ? own : workspace_;
        struct Release {
            Workspace& ws;
            explicit Release(Workspace& w) : ws(w) { ws.busy = true; }
            ~Release() { ws.release(); }
        } release(ws);
        BatchInput& in = ws.in;
        in.split_words = o.split_words;
        py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(texts.ptr(), "texts must be a sequence"));
        if (!seq) throw py::error_already_set();
        const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        in.a.reserve(n + 1);
        in.segs.reserve(n);
        // Once the batch is large enough for the pool, its workers are started, so that they run
        // by the time the inputs are read (a sleeping thread takes tens of microseconds to wake).
        size_t read = o.num_threads > 1 && n > 1 ? 0 : SIZE_MAX;
        for (size_t i = 0; i < n; ++i) {
            if (i + kReadAhead < n) __builtin_prefetch(items[i + kReadAhead]);
            add_item(items[i], false, i, o.split_words, ws);
            in.a.push_back(static_cast<uint32_t>(in.segs.size()));
            if (read < Tokenizer::kWakeBytes) {
                for (uint32_t k = in.a[i]; k < in.a[i + 1]; ++k) read += in.segs[k].size();
                if (read >= Tokenizer::kWakeBytes) tok_->wake_pool(o.num_threads);
            }
        }
        if (!pairs.is_none()) {
            py::object pseq =
                py::reinterpret_steal<py::object>(PySequence_Fast(pairs.ptr(), "text_pair must be a sequence"));
            if (!pseq) throw py::error_already_set();
            if (static_cast<size_t>(PySequence_Fast_GET_SIZE(pseq.ptr())) != n)
                throw py::value_error("text and text_pair have different lengths");
            PyObject** pitems = PySequence_Fast_ITEMS(pseq.ptr());
            in.b.reserve(n + 1);
            in.b.push_back(static_cast<uint32_t>(in.segs.size()));
            for (size_t i = 0; i < n; ++i) {
                if (i + kReadAhead < n) __builtin_prefetch(pitems[i + kReadAhead]);
                if (pitems[i] == Py_None) {  // no pair for this item (a batch mixing texts and pairs)
                    in.single.resize(n, 0);
                    in.single[i] = 1;
                } else {
                    add_item(pitems[i], true, i, o.split_words, ws);
                }
                in.b.push_back(static_cast<uint32_t>(in.segs.size()));
            }
        }
        std::vector<Rows>& rows = ws.rows;
        clock.mark(stage_ns_, kInputs);
        size_t bytes = 0;
        for (const std::string_view& seg : in.segs) bytes += seg.size();
        // a short input is encoded in about the time that releasing and taking back the GIL takes
        const bool gil_released = bytes >= kReleaseGilBytes;
        Tokenizer::ChunkHooks hooks;
        // the non-ASCII strs' UTF-8, made by the thread that encodes them, just before it does
        std::atomic<size_t> bad_text{SIZE_MAX};
        ws.utf8.resize(ws.pending.size());
        if (!ws.pending.empty())
            hooks.prepare = [&ws, &bad_text](size_t begin, size_t end) { return to_utf8(ws, begin, end, bad_text); };
        // Padded arrays whose shape is known before encoding (padding="max_length", rows cut to
        // fit, one row per item) are filled by the thread that encoded each chunk, right after it and
        // while its rows are in that core's cache, not in a second parallel pass after the batch.
        py::dict out;
        const bool fill_early = o.numpy && !o.packed && !o.overflow && !o.words &&
                                o.padding == Padding::kMaxLength && o.truncation != Truncation::kNone;
        const size_t early_width = fill_early ? padded_width(o, 0) : 0;
        PadOut early;
        if (fill_early) {
            early = padded_arrays(n, early_width, o, out);
            hooks.encoded = [&early, early_width, &o](const Rows& rs) {
                if (rs.rows()) fill_padded_rows(rs, static_cast<size_t>(rs.item[0]), early_width, o, early);
            };
            clock.mark(stage_ns_, kOutputGil);
        }
        // Lists whose shape is known before encoding (one row per item, a fixed width) are built
        // chunk by chunk on this thread, with the GIL taken back for each chunk, while the pool
        // encodes the chunks after it: building them was the largest serial step of a batch.
        std::unique_ptr<ListBuilder> builder;
        if (!o.packed && !o.numpy && !o.overflow && o.padding != Padding::kLongest) {
            const size_t width = o.padding == Padding::kMaxLength ? padded_width(o, 0) : 0;
            try {
                check_cells(n, width);
                builder.reset(new ListBuilder(n, width, o, *ints_));
            } catch (const LayoutTooLarge& e) {
                PyErr_SetString(PyExc_MemoryError, e.what());
                throw py::error_already_set();
            } catch (const PythonError&) {
                throw py::error_already_set();
            }
            PyThreadState* const state = PyThreadState_Get();
            hooks.consume = [&builder, &rows, gil_released, state](size_t c) {
                // at interpreter exit this may not return (see take_gil): nothing to undo yet
                if (gil_released) take_gil(state);
                try {
                    GcPause pause;
                    builder->add(rows[c]);
                } catch (...) {
                    if (gil_released) PyEval_SaveThread();
                    throw;
                }
                if (gil_released) PyEval_SaveThread();
            };
        }
        // A lone surrogate: Python's encoder raises, with the same message as ever. It names the
        // first such str, also when another item failed too (a task's error skips later chunks,
        // so every pending str is checked then).
        auto raise_bad_text = [&](bool check_all) {
            if (check_all && bad_text.load() == SIZE_MAX) to_utf8(ws, 0, n, bad_text);
            if (bad_text.load() == SIZE_MAX) return;
            const PendingText& p = ws.pending[bad_text.load()];
            utf8_or_raise(p.text, p.pair, p.index, p.word);
        };
        try {
            if (!gil_released) {
                tok_->encode_batch(in, o, rows, hooks);
            } else {
                without_gil([&] { tok_->encode_batch(in, o, rows, hooks); });
            }
        } catch (const TruncationError& e) {
            raise_bad_text(true);
            throw py::value_error(e.what());
        } catch (const std::invalid_argument& e) {
            raise_bad_text(true);
            throw py::value_error(e.what());
        } catch (const PythonError&) {
            throw py::error_already_set();
        }
        raise_bad_text(false);
        clock.mark(stage_ns_, kEncode);
        Layout layout;
        try {
            layout = plan_layout(rows, o);
        } catch (const LayoutTooLarge& e) {
            // a MemoryError that names the shape, never a size that overflows or an allocation
            // that fails halfway through the outputs
            PyErr_SetString(PyExc_MemoryError, e.what());
            throw py::error_already_set();
        }
        const ParallelFor run = [&](size_t count, const std::function<void(size_t)>& fn) {
            tok_->parallel(count, o.num_threads, fn);
        };
        clock.mark(stage_ns_, kLayout);
        if (o.packed) {
            pack(rows, layout, o, run, out);
        } else if (fill_early && layout.rect) {
            // filled while encoding (a row longer than the width, e.g. max_length below the
            // special tokens' count, leaves the layout ragged: the lists below then)
        } else if (o.numpy && layout.rect && !o.words) {
            const PadOut po = padded_arrays(layout.rows, layout.width, o, out);
            clock.mark(stage_ns_, kOutputGil);
            without_gil([&] { fill_padded(rows, layout, o, po, run); });
            clock.mark(stage_ns_, kOutputThreads);
        } else if (builder) {
            if (builder->filled() != layout.rows)
                throw std::logic_error("fastbert: " + std::to_string(layout.rows) + " rows, " +
                                       std::to_string(builder->filled()) + " of them as lists");
            put_lists(builder->lists(), out);
        } else {
            out = py::dict();  // without the arrays filled early, when the rows did not fit them
            lists(rows, layout, o, out);
        }
        clock.mark(stage_ns_, kOutputGil);
        if (o.length) {
            py::list lengths(layout.rows);
            size_t k = 0;
            const size_t width = o.padding != Padding::kNone ? layout.width : 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r) lengths[k++] = int_obj(std::max(rs.len(r), width));
            out[keys_.length] = lengths;
        }
        if (o.words) {  // alignment: which windows of A and B each row holds, and A's token count
            py::list windows(layout.rows);
            size_t k = 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r)
                    windows[k++] = py::make_tuple(int_obj(rs.window[3 * r]), int_obj(rs.window[3 * r + 1]),
                                                  int_obj(rs.window[3 * r + 2]));
            out[keys_.windows] = windows;
        }
        if (o.overflow) {
            py::list mapping(layout.rows);
            size_t k = 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r) mapping[k++] = int_obj(rs.item[r]);
            out[keys_.overflow_to_sample_mapping] = mapping;
        }
        clock.mark(stage_ns_, kExtras);
        return py::make_tuple(out, layout.widest);
    }

    // The padded int64 arrays the options ask for, rows x width (offsets rows x width x 2), put in out.
    PadOut padded_arrays(size_t rows, size_t width, const EncodeOptions& o, py::dict& out) {
        try {
            check_cells(rows, width);
        } catch (const LayoutTooLarge& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
            throw py::error_already_set();
        }
        size_t bytes = 0;
        auto mk = [&](bool want, const py::str& key, bool pairs2 = false) -> int64_t* {
            if (!want) return nullptr;
            std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)};
            if (pairs2) shape.push_back(2);
            py::array_t<int64_t> a = pooled_array(pool_, shape);
            out[key] = a;
            bytes += static_cast<size_t>(a.nbytes());
            return a.mutable_data();
        };
        PadOut po;
        po.ids = mk(true, keys_.input_ids);
        po.type_ids = mk(o.type_ids, keys_.token_type_ids);
        po.attention = mk(o.attention_mask, keys_.attention_mask);
        po.special = mk(o.special_tokens_mask, keys_.special_tokens_mask);
        po.offsets = mk(o.offsets, keys_.offset_mapping, true);
        po.stream = bytes >= kStreamBytes;
        return po;
    }

    // The stages' CPU seconds summed since the last call (empty unless built with
    // -DFASTBERT_STAGE_TIMES); resets them.
    py::dict stage_times() {
        py::dict d;
        if (kStageTimes)
            for (int s = 0; s < kStages; ++s) d[kStageNames[s]] = stage_ns_[s] * 1e-9;
        stage_ns_.fill(0);
        return d;
    }

    // The thread pool's last batch: {"runs", "tasks", "worker_tasks", "worker_start_us", "caller_cpu",
    // "run_us", "caller_busy_us", "worker_busy_us"}
    // (see ThreadPool::LastRun; worker_start_us None when the calling thread ran every task,
    // caller_cpu None where the core is not known).
    py::dict pool_last_run() {
        ThreadPool::LastRun r;
        {
            // the pool's lock may be held by a batch on another thread that waits for the GIL
            py::gil_scoped_release release;
            r = tok_->last_pool_run();
        }
        py::dict d;
        d["runs"] = r.runs;
        d["tasks"] = r.tasks;
        d["worker_tasks"] = r.worker_tasks;
        d["worker_start_us"] = r.worker_start_us < 0 ? py::object(py::none()) : py::object(py::float_(r.worker_start_us));
        d["caller_cpu"] = r.caller_cpu < 0 ? py::object(py::none()) : py::object(py::int_(r.caller_cpu));
        d["run_us"] = r.run_us;
        d["caller_busy_us"] = r.caller_busy_us;
        d["worker_busy_us"] = r.worker_busy_us;
        return d;
    }

    py::object id_to_token(int64_t id) const {
        if (id < 0 || !tok_->vocab().has_id(static_cast<size_t>(id))) return py::none();
        return py::str(tok_->vocab().token(static_cast<size_t>(id)));
    }
    py::object token_to_id(const std::string& t) const {
        const int32_t id = tok_->token_id(t);
        if (id < 0) return py::none();
        return py::int_(id);
    }
    std::vector<std::string> tokens() const { return tok_->vocab().tokens(); }
    size_t size() const { return tok_->vocab().distinct(); }
    size_t base_size() const { return base_size_; }
    size_t base_ids() const { return base_ids_; }
    void clear_cache() { tok_->clear_cache(); }
    py::str normalize(const std::string& text) const {
        const std::string out = tok_->normalize(text);
        return py::str(out.data(), out.size());
    }
    void set_specials(int32_t cls, int32_t sep) { tok_->set_specials(cls, sep); }
    // (id, type id) pieces, id -1 for $A and -2 for $B: HF's TemplateProcessing with single-id specials
    void set_template(const std::vector<std::pair<int32_t, int>>& single,
                      const std::vector<std::pair<int32_t, int>>& pair) {
        auto pieces = [](const std::vector<std::pair<int32_t, int>>& t) {
            std::vector<Piece> out;
            for (const auto& p : t) {
                if (p.second < 0 || p.second > 255)
                    throw py::value_error("template: a type id must be in 0..255, got " + std::to_string(p.second));
                out.push_back(Piece{p.first, static_cast<uint8_t>(p.second)});
            }
            return out;
        };
        try {
            tok_->set_template(Template{pieces(single), pieces(pair)});
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
    }

 private:
    py::object int_obj(size_t v) const {
        try {
            return py::reinterpret_steal<py::object>(ints_->new_ref(v));
        } catch (const PythonError&) {
            throw py::error_already_set();
        }
    }

    // Packed output: 1-D arrays of every row's real tokens back to back, cu_seqlens and max_seqlen.
    void pack(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const ParallelFor& run,
              py::dict& out) {
        const std::vector<py::ssize_t> flat{static_cast<py::ssize_t>(layout.tokens)};
        auto mk = [&](bool want, const py::str& key, std::vector<py::ssize_t> shape = {}) -> int64_t* {
            if (!want) return nullptr;
            py::array_t<int64_t> a = pooled_array(pool_, shape.empty() ? flat : shape);
            out[key] = a;
            return a.mutable_data();
        };
        PackedOut po;
        po.ids = mk(true, keys_.input_ids);
        po.type_ids = mk(o.type_ids, keys_.token_type_ids);
        po.position_ids = mk(true, keys_.position_ids);
        po.special = mk(o.special_tokens_mask, keys_.special_tokens_mask);
        po.offsets = mk(o.offsets, keys_.offset_mapping, {static_cast<py::ssize_t>(layout.tokens), 2});
        py::array_t<int32_t> cu(static_cast<py::ssize_t>(layout.rows + 1));
        po.cu_seqlens = cu.mutable_data();
        try {
            without_gil([&] { fill_packed(rows, po, run); });
        } catch (const LayoutTooLarge& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
            throw py::error_already_set();
        }
        out[keys_.cu_seqlens] = cu;
        out[keys_.max_seqlen] = int_obj(layout.widest);
    }

    void lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, py::dict& out) {
        // Thousands of new lists would trigger the cyclic GC again and again while we build
        // them; none of them can be part of a cycle, so pause it for the duration.
        GcPause pause;
        try {
            ListBuilder b(layout.rows, layout.width, o, *ints_);
            for (const Rows& rs : rows) b.add(rs);
            put_lists(b.lists(), out);
        } catch (const PythonError&) {
            throw py::error_already_set();
        }
    }

    void put_lists(const RowLists& l, py::dict& out) {
        auto put = [&](const py::str& key, PyObject* v) {
            if (v) out[key] = py::reinterpret_borrow<py::object>(v);
        };
        put(keys_.input_ids, l.ids);
        put(keys_.token_type_ids, l.type_ids);
        put(keys_.attention_mask, l.attention);
        put(keys_.special_tokens_mask, l.special);
        put(keys_.offset_mapping, l.offsets);
        put(keys_.word_ids, l.words);
    }

    // "batch item 3" / "text_pair item 3" or, for a pre-split word (word >= 0), "word 2 of batch item 3";
    // made only on error
    static std::string where(bool pair, size_t index, long word) {
        const std::string item = std::string(pair ? "text_pair" : "batch") + " item " + std::to_string(index);
        return word < 0 ? item : "word " + std::to_string(word) + " of " + item;
    }

    // The UTF-8 bytes of str h (Python's, made and cached in h if needed), or a ValueError naming
    // the item.
    static std::string_view utf8_or_raise(PyObject* h, bool pair, size_t index, long word) {
        Py_ssize_t len = 0;
        const char* p = PyUnicode_AsUTF8AndSize(h, &len);
        if (!p) {
            PyErr_Clear();
            const Py_ssize_t n = PyUnicode_GetLength(h);
            for (Py_ssize_t j = 0; j < n; ++j) {
                Py_UCS4 c = PyUnicode_ReadChar(h, j);
                if (c >= 0xD800 && c < 0xE000) {
                    char buf[16];
                    snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
                    throw py::value_error(where(pair, index, word) + " has a lone surrogate " + buf + " at character " +
                                          std::to_string(j) + "; it cannot be encoded as UTF-8");
                }
            }
            throw py::value_error(where(pair, index, word) + " cannot be encoded as UTF-8");
        }
        return std::string_view(p, static_cast<size_t>(len));
    }

    // Adds str h as the next segment. A non-ASCII str without a UTF-8 form yet is encoded later,
    // without the GIL by the thread that encodes it (to_utf8): encoding it here was the largest
    // serial part of a batch of new non-ASCII text. Until then its segment is the str's own
    // characters, as long as chunk_bounds needs (about its UTF-8 size).
    void add_text(py::handle h, bool pair, size_t index, long word, Workspace& ws) {
        PyObject* o = h.ptr();
        if (!PyUnicode_Check(o))
            throw py::type_error(where(pair, index, word) + " is " + std::string(Py_TYPE(o)->tp_name) + ", not str");
        BatchInput& in = ws.in;
#if PY_VERSION_HEX < 0x030C0000
        const bool ready = PyUnicode_IS_READY(o);
#else
        const bool ready = true;
#endif
        if (!ready || PyUnicode_IS_ASCII(o) || !PyUnicode_IS_COMPACT(o) ||
            reinterpret_cast<PyCompactUnicodeObject*>(o)->utf8 != nullptr) {
            in.segs.push_back(utf8_or_raise(o, pair, index, word));
        } else {
            const size_t chars = static_cast<size_t>(PyUnicode_GET_LENGTH(o));
            ws.pending.push_back(PendingText{o, in.segs.size(), chars, pair, index, word});
            in.segs.emplace_back(static_cast<const char*>(PyUnicode_DATA(o)), chars * PyUnicode_KIND(o));
        }
        Py_INCREF(o);
        ws.refs.push_back(o);
    }

    // The UTF-8 form of the pending strs of items [begin, end) (read without the GIL: a str is
    // immutable and the batch holds a reference), into their segments; false when one has a lone
    // surrogate (the first such str in the batch ends in bad).
    static bool to_utf8(Workspace& ws, size_t begin, size_t end, std::atomic<size_t>& bad) {
        const std::vector<PendingText>& pending = ws.pending;
        bool ok = true;
        for (const bool pair : {false, true}) {
            auto it = std::lower_bound(pending.begin(), pending.end(), std::make_pair(pair, begin),
                                       [](const PendingText& p, const std::pair<bool, size_t>& key) {
                                           return std::make_pair(p.pair, p.index) < key;
                                       });
            for (; it != pending.end() && it->pair == pair && it->index < end; ++it) {
                const size_t k = static_cast<size_t>(it - pending.begin());
                if (!encode_utf8(PyUnicode_KIND(it->text), PyUnicode_DATA(it->text), it->chars, ws.utf8[k])) {
                    size_t seen = bad.load();
                    while (k < seen && !bad.compare_exchange_weak(seen, k)) {
                    }
                    ok = false;
                    break;  // the rest of this group cannot come first
                }
                ws.in.segs[it->seg] = ws.utf8[k];
            }
        }
        return ok;
    }

    void add_item(py::handle h, bool pair, size_t index, bool split_words, Workspace& ws) {
        if (!split_words) {
            add_text(h, pair, index, -1, ws);
            return;
        }
        if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr()))
            throw py::type_error(where(pair, index, -1) + " is " +
                                 std::string(Py_TYPE(h.ptr())->tp_name) +
                                 ", not a list of words (is_split_into_words=True)");
        long k = 0;
        for (py::handle w : py::reinterpret_borrow<py::sequence>(h)) add_text(w, pair, index, k++, ws);
    }

    // The input strs are objects all over the heap, read one after the other with the GIL held (the
    // serial part of a batch): each one's header is loaded this many strs ahead, so that their
    // cache misses overlap (on inputs gone cold, one miss per str was most of that serial part).
    static constexpr size_t kReadAhead = 16;

    // Per-thread buffers of encode_batch (see there).
    struct Workspace {
        BatchInput in;
        // a reference to each input str the batch points into: another Python thread may change
        // the caller's list while the GIL is released
        std::vector<PyObject*> refs;
        std::vector<Rows> rows;
        std::vector<PendingText> pending;  // strs to encode as UTF-8 without the GIL, and their bytes
        std::vector<std::string> utf8;
        bool busy = false;
        // Drops the input references, empties the buffers and keeps their memory, unless a large
        // batch grew them: an idle thread should not hold its largest batch's rows.
        void release() {
            for (size_t k = 0; k < refs.size(); ++k) {
                if (k + kReadAhead < refs.size()) __builtin_prefetch(refs[k + kReadAhead], 1);
                Py_DECREF(refs[k]);
            }
            refs.clear();
            size_t held = in.segs.capacity() * sizeof(std::string_view);
            for (const std::string& u : utf8) held += u.capacity();
            for (const Rows& r : rows)
                held += r.ids.capacity() * sizeof(int32_t) + r.offsets.capacity() * sizeof(uint32_t);
            if (held > kKeepBytes) {
                *this = Workspace();
                return;
            }
            pending.clear();
            for (std::string& u : utf8) u.clear();  // keeps their memory for the next batch
            in.segs.clear();
            in.a.assign(1, 0);
            in.b.clear();
            in.single.clear();
            busy = false;
        }
        static constexpr size_t kKeepBytes = size_t{1} << 20;
    };
    static thread_local Workspace workspace_;

    std::unique_ptr<Tokenizer> tok_;
    std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
    std::unique_ptr<IntTable> ints_;
    // output keys, made (and hashed) once instead of per call
    struct Keys {
        py::str input_ids{"input_ids"}, token_type_ids{"token_type_ids"}, attention_mask{"attention_mask"},
            special_tokens_mask{"special_tokens_mask"}, offset_mapping{"offset_mapping"}, word_ids{"word_ids"},
            length{"length"}, windows{"windows"}, overflow_to_sample_mapping{"overflow_to_sample_mapping"},
            position_ids{"position_ids"}, cu_seqlens{"cu_seqlens"}, max_seqlen{"max_seqlen"};
    } keys_;
    static constexpr size_t kReleaseGilBytes = 2048;
    size_t base_size_ = 0;  // distinct tokens of the vocabulary file (HF's vocab_size)
    size_t base_ids_ = 0;   // its lines
    std::array<double, kStages> stage_ns_{};  // with FASTBERT_STAGE_TIMES (one caller at a time)
};

thread_local PyTokenizer::Workspace PyTokenizer::workspace_;

// EncodeOptions(**fields): every field by name, the rest at their defaults; an unknown name is a
// TypeError. One table of fields serves the constructor, the read-only attributes and repr.
struct OptionField {
    const char* name;
    bool EncodeOptions::*flag;
    size_t EncodeOptions::*size;
};
const OptionField kOptionFields[] = {
    {"split_words", &EncodeOptions::split_words, nullptr},
    {"add_special_tokens", &EncodeOptions::add_special_tokens, nullptr},
    {"split_special_tokens", &EncodeOptions::split_special_tokens, nullptr},
    {"max_length", nullptr, &EncodeOptions::max_length},
    {"stride", nullptr, &EncodeOptions::stride},
    {"truncate_left", &EncodeOptions::truncate_left, nullptr},
    {"pad_to_multiple_of", nullptr, &EncodeOptions::pad_to_multiple_of},
    {"pad_left", &EncodeOptions::pad_left, nullptr},
    {"packed", &EncodeOptions::packed, nullptr},
    {"type_ids", &EncodeOptions::type_ids, nullptr},
    {"attention_mask", &EncodeOptions::attention_mask, nullptr},
    {"special_tokens_mask", &EncodeOptions::special_tokens_mask, nullptr},
    {"offsets", &EncodeOptions::offsets, nullptr},
    {"length", &EncodeOptions::length, nullptr},
    {"overflow", &EncodeOptions::overflow, nullptr},
    {"numpy", &EncodeOptions::numpy, nullptr},
    {"words", &EncodeOptions::words, nullptr},
};

EncodeOptions make_options(const py::kwargs& kw) {
    EncodeOptions o;
    for (const auto& item : kw) {
        const std::string name = py::str(item.first);
        py::handle v = item.second;
        if (name == "truncation") {
            o.truncation = v.cast<Truncation>();
        } else if (name == "padding") {
            o.padding = v.cast<Padding>();
        } else if (name == "pad_id") {
            o.pad_id = v.cast<int64_t>();
        } else if (name == "num_threads") {
            o.num_threads = v.cast<int>();
        } else {
            const OptionField* f = nullptr;
            for (const OptionField& x : kOptionFields)
                if (name == x.name) f = &x;
            if (!f) throw py::type_error("EncodeOptions() got an unexpected keyword argument '" + name + "'");
            if (f->flag) {
                if (!PyBool_Check(v.ptr())) throw py::type_error("EncodeOptions: " + name + " must be a bool");
                o.*(f->flag) = v.ptr() == Py_True;
            } else {
                o.*(f->size) = v.cast<size_t>();
            }
        }
    }
    try {
        o.validate();
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
    return o;
}

std::string options_repr(const EncodeOptions& o) {
    std::string s = "EncodeOptions(truncation=" + std::to_string(static_cast<int>(o.truncation)) +
                    ", padding=" + std::to_string(static_cast<int>(o.padding)) + ", pad_id=" + std::to_string(o.pad_id) +
                    ", num_threads=" + std::to_string(o.num_threads);
    for (const OptionField& f : kOptionFields)
        s += std::string(", ") + f.name + "=" + (f.flag ? (o.*(f.flag) ? "True" : "False") : std::to_string(o.*(f.size)));
    return s + ")";
}


}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "fastbert C++ core: WordPiece tokenizer";
    py::enum_<Truncation>(m, "Truncation")
        .value("none", Truncation::kNone)
        .value("longest_first", Truncation::kLongestFirst)
        .value("only_first", Truncation::kOnlyFirst)
        .value("only_second", Truncation::kOnlySecond);
    py::enum_<Padding>(m, "Padding")
        .value("none", Padding::kNone)
        .value("longest", Padding::kLongest)
        .value("max_length", Padding::kMaxLength);
    py::class_<EncodeOptions> options(m, "EncodeOptions",
                                      "The options of one encode call, by name (read-only once made).");
    options.def(py::init(&make_options))
        .def_readonly("truncation", &EncodeOptions::truncation)
        .def_readonly("padding", &EncodeOptions::padding)
        .def_readonly("pad_id", &EncodeOptions::pad_id)
        .def_readonly("num_threads", &EncodeOptions::num_threads)
        .def("for_alignment", &EncodeOptions::for_alignment)
        .def("__repr__", &options_repr);
    for (const OptionField& f : kOptionFields) {
        if (f.flag)
            options.def_property_readonly(f.name, [p = f.flag](const EncodeOptions& o) { return o.*p; });
        else
            options.def_property_readonly(f.name, [p = f.size](const EncodeOptions& o) { return o.*p; });
    }
    py::class_<PyTokenizer>(m, "Tokenizer")
        .def(py::init<py::object, bool, bool, bool, bool, const std::string&, const std::string&, size_t,
                      const std::vector<std::tuple<std::string, bool, bool, bool, bool, bool>>&>(),
             py::arg("vocab"), py::arg("lowercase"), py::arg("strip_accents"), py::arg("handle_chinese_chars"),
             py::arg("clean_text"), py::arg("unk_token"), py::arg("continuing_subword_prefix"),
             py::arg("max_input_chars_per_word"), py::arg("added_tokens"))
        .def("encode_batch", &PyTokenizer::encode_batch, py::arg("texts"), py::arg("pairs"), py::arg("options"))
        .def("id_to_token", &PyTokenizer::id_to_token)
        .def("token_to_id", &PyTokenizer::token_to_id)
        .def("tokens", &PyTokenizer::tokens)
        .def("set_specials", &PyTokenizer::set_specials)
        .def("set_template", &PyTokenizer::set_template, py::arg("single"), py::arg("pair"))
        .def("base_size", &PyTokenizer::base_size)
        .def("base_ids", &PyTokenizer::base_ids)
        .def("clear_cache", &PyTokenizer::clear_cache)
        .def("stage_times", &PyTokenizer::stage_times)
        .def("pool_last_run", &PyTokenizer::pool_last_run)
        .def("normalize", &PyTokenizer::normalize, py::arg("text"))
        .def("__len__", &PyTokenizer::size);
}
