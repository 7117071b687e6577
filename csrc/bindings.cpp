// Module fastbert._C: binds EncodeOptions and the tokenizer. A batch's Python inputs become UTF-8
// views here (with the GIL), the batch runs without the GIL, and py_outputs makes its outputs
// (numpy buffers, packed or padded, or lists).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "encode_options.h"
#include "output_layout.h"
#include "py_gil.h"
#include "py_lists.h"
#include "py_outputs.h"
#include "stage_clock.h"
#include "tokenizer.h"

namespace py = pybind11;
using namespace fastbert;

namespace fastbert {
void bind_int8_rows(py::module_& m);  // py_quantized_linear.cpp
void bind_attention(py::module_& m);  // py_attention.cpp
void bind_linear(py::module_& m);     // py_linear.cpp
void bind_layers(py::module_& m);     // py_layers.cpp
}

namespace {

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
        outputs_.reset(new Outputs(std::max<size_t>(tok_->vocab().size(), 65536)));
    }

    // (out, widest row): the outputs as a dict, and the longest row's length (the long-sequence notice).
    py::tuple encode_batch(py::object texts, py::object pairs, const EncodeOptions& o) {
        StageClock clock(stage_ns_);
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
        clock.mark(kInputs);
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
        BatchOutput output(*outputs_, o, n, gil_released, rows, hooks, clock);
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
        clock.mark(kEncode);
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
        clock.mark(kLayout);
        return py::make_tuple(output.finish(layout, run, clock), layout.widest);
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
    std::unique_ptr<Outputs> outputs_;
    static constexpr size_t kReleaseGilBytes = 2048;
    size_t base_size_ = 0;  // distinct tokens of the vocabulary file (HF's vocab_size)
    size_t base_ids_ = 0;   // its lines
    StageTimes stage_ns_{};  // with FASTBERT_STAGE_TIMES (one caller at a time)
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
    m.doc() = "fastbert C++ core: WordPiece tokenizer, the row-wise passes of the int8 linear, CPU attention, a small-M fp32 GEMM and the layer stack over it";
    bind_int8_rows(m);
    bind_attention(m);
    bind_linear(m);
    bind_layers(m);
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
