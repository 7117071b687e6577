#include "tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <stdexcept>

namespace fastbert {

namespace {

size_t count_chars(const char* s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; ++i) c += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
    return c;
}

}  // namespace

static int32_t require_unk(const Vocab& vocab, const std::string& unk) {
    const int32_t id = vocab.id(unk);
    if (id < 0) throw std::invalid_argument("the vocabulary has no unknown token " + unk);
    return id;
}

Tokenizer::Tokenizer(Vocab vocab, const TokenizerConfig& cfg, std::vector<AddedToken> added)
    : vocab_(std::move(vocab)),
      normalizer_(cfg.normalizer),
      identity_pre_(Normalizer(NormalizerConfig{false, false, false, false})),
      pre_(Normalizer(cfg.normalizer)),
      wordpiece_(vocab_, require_unk(vocab_, cfg.unk_token), cfg.continuing_subword_prefix,
                 cfg.max_input_chars_per_word) {
    std::vector<AddedToken> raw, normalized, raw_plain, normalized_plain;
    for (AddedToken& t : added) {
        if (t.id < 0) t.id = vocab_.add(t.content);
        if (t.normalized) t.content = normalize(t.content);  // HF matches it by its normalized content
        (t.normalized ? normalized : raw).push_back(t);
        if (!t.special) (t.normalized ? normalized_plain : raw_plain).push_back(t);
    }
    added_ = AddedTokens(std::move(raw));
    added_normalized_ = AddedTokens(std::move(normalized));
    added_plain_ = AddedTokens(std::move(raw_plain));
    added_normalized_plain_ = AddedTokens(std::move(normalized_plain));
}

bool Tokenizer::encode_piece(const char* text, size_t len, uint32_t char_base, bool offsets, Scratch& s,
                             Encoded& out, size_t limit) const {
    if (!normalized_added(s).empty()) {
        encode_normalized(text, len, char_base, offsets, s, out, limit);
        return out.ids.size() <= limit;
    }
    if (!offsets && s.chunks) {
        encode_cached(text, len, s, out, limit);
        return out.ids.size() <= limit;
    }
    pre_.run(text, len, char_base, offsets, s.pre, [&](const Word& w) {
        const size_t first = out.ids.size();
        if (!offsets) {
            if (s.cache) wordpiece_.tokenize(w, out.ids, nullptr, *s.cache);
            else wordpiece_.tokenize(w, out.ids, nullptr);
            return out.ids.size() <= limit;
        }
        s.spans.clear();
        if (s.cache) wordpiece_.tokenize(w, out.ids, &s.spans, *s.cache);
        else wordpiece_.tokenize(w, out.ids, &s.spans);
        for (size_t t = first; t < out.ids.size(); ++t) {
            const uint32_t b = s.spans[2 * (t - first)], e = s.spans[2 * (t - first) + 1];
            out.offsets.push_back(w.orig[b]);
            out.offsets.push_back(w.orig[e - 1] + 1);
        }
        s.mark_word(out);
        return out.ids.size() <= limit;
    });
    return out.ids.size() <= limit;
}

namespace {

inline bool is_separator(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length (1..15) of the chunk at p when a separator ends it within p's 16 readable bytes,
// else 0. Eight bytes at a time: the lowest byte below 0x21 (SWAR "has less than", exact for
// the lowest byte) is where the chunk may end; no loop over bytes, no branch per byte.
inline size_t short_chunk_len(const char* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    constexpr uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
    const uint64_t a = load64(p), b = load64(p + 8);
    const uint64_t ma = (a - 0x21 * kOnes) & ~a & kHigh, mb = (b - 0x21 * kOnes) & ~b & kHigh;
    size_t n;
    if (ma) n = static_cast<size_t>(__builtin_ctzll(ma)) / 8;
    else if (mb) n = 8 + static_cast<size_t>(__builtin_ctzll(mb)) / 8;
    else return 0;
    return is_separator(p[n]) ? n : 0;  // a control character inside a chunk: the slow way
#else
    (void)p;
    return 0;
#endif
}

}  // namespace

void Tokenizer::encode_cached(const char* text, size_t len, Scratch& s, Encoded& out, size_t limit) const {
    const size_t first = out.ids.size();
    if (!s.texts || !TextCache::fits(len) || first > limit) {
        encode_chunks(text, len, s, out, limit);
        return;
    }
    size_t from = 0;
    TextCache::Hit hit;
    if (s.texts->find(text, len, hit)) {
        // no more ids than the truncation limit keeps (the rest would be cut off again)
        const size_t take = limit == SIZE_MAX ? hit.count : std::min(hit.count, limit + 1 - first);
        out.ids.insert(out.ids.end(), hit.ids, hit.ids + take);
        if (hit.done == len || out.ids.size() > limit) return;
        from = hit.done;  // a truncated encoding was cached and more is needed now: continue it
    }
    const Progress p = encode_chunks(text + from, len - from, s, out, limit);
    s.texts->put(text, len, from + p.bytes, out.ids.data() + first, p.ids - first);
}

Tokenizer::Progress Tokenizer::encode_chunks(const char* text, size_t len, Scratch& s, Encoded& out,
                                             size_t limit) const {
    ChunkCache& cache = *s.chunks;
    SharedChunkCache& shared = short_chunks_;
    const uint64_t epoch = shared.epoch();
    auto tokenize_chunk = [&](const char* c, size_t n, bool whole) {
        pre_.run(c, n, 0, false, s.pre, [&](const Word& w) {
            wordpiece_.tokenize(w, out.ids, nullptr, *s.cache);
            return whole || out.ids.size() <= limit;  // cached chunks must be whole
        });
    };
    // Chunks are found a batch ahead and their cache slots prefetched: a probe then rarely waits
    // for memory (the slot load was the single hottest instruction when chunks went one by one).
    constexpr size_t kAhead = 16;
    struct Next {
        size_t at, n, slot;  // slot: the chunk's in the shared cache, computed once
        ShortChunk key;
    } next[kAhead];
    Progress done{0, out.ids.size()};
    size_t i = 0;
    while (i < len && out.ids.size() <= limit) {
        size_t m = 0;
        while (m < kAhead && i < len) {
            // skip the separators, then take the chunk up to the next one
            while (i < len && is_separator(text[i])) ++i;
            if (i == len) break;
            const char* c = text + i;
            Next& x = next[m++];
            x.at = i;
            x.n = len - i >= 16 ? short_chunk_len(c) : 0;
            if (x.n) {
                x.key = ShortChunk::of16(c, x.n);
            } else {
                while (x.n < len - i && !is_separator(c[x.n])) ++x.n;
                x.key = x.n <= ShortChunk::kMax ? ShortChunk::of(c, x.n) : ShortChunk{};
            }
            if (x.n <= ShortChunk::kMax) {
                x.slot = SharedChunkCache::slot_of(x.key);
                shared.prefetch(x.slot);
            }
            i += x.n;
        }
        for (size_t k = 0; k < m && out.ids.size() <= limit; ++k) {
            const char* c = text + next[k].at;
            const size_t n = next[k].n;
            size_t count = 0;
            const size_t first = out.ids.size();
            using Found = SharedChunkCache::Found;
            const Found found =
                n <= ShortChunk::kMax ? shared.find(next[k].key, next[k].slot, epoch, out.ids) : Found::kNotKept;
            if (found == Found::kHit) {
                // its ids are in out
            } else if (found == Found::kMiss) {
                tokenize_chunk(c, n, true);
                count = out.ids.size() - first;
                shared.put(next[k].key, next[k].slot, epoch, out.ids.data() + first, count);
                // too many ids for the shared cache: it notes that this thread's own cache has them
                if (count > SharedChunkCache::kMaxIds) cache.put(c, n, hash_bytes(c, n), out.ids.data() + first, count);
            } else if (n > ChunkCache::kMaxKey) {
                tokenize_chunk(c, n, false);
                if (out.ids.size() > limit) break;  // perhaps cut inside the chunk: not done
            } else {
                const uint64_t h = hash_bytes(c, n);
                if (const int32_t* ids = cache.find(c, n, h, &count)) {
                    out.ids.insert(out.ids.end(), ids, ids + count);
                } else {
                    tokenize_chunk(c, n, true);
                    cache.put(c, n, h, out.ids.data() + first, out.ids.size() - first);
                }
            }
            done = Progress{next[k].at + n, out.ids.size()};
        }
    }
    if (out.ids.size() <= limit) done = Progress{len, out.ids.size()};  // every chunk went in
    return done;
}

void Tokenizer::encode_normalized(const char* text, size_t len, uint32_t char_base, bool offsets, Scratch& s,
                                  Encoded& out, size_t limit) const {
    // 1. normalize, remembering each output character's original index (HF's NormalizedString)
    PreTokenizer::Buffer& n = s.norm;
    std::vector<uint32_t>& orig = s.norm_orig;
    normalize_into(text, len, char_base, s.marks, n, &orig);
    // 2. find the normalized added tokens; 3. split and WordPiece the rest (already normalized)
    normalized_added(s).find(n.data(), n.size(), s.norm_matches);
    size_t pos = 0, chars = 0;
    auto region = [&](size_t b, size_t e, size_t char_at) {
        identity_pre_.run(n.data() + b, e - b, 0, true, s.pre, [&](const Word& w) {
            const size_t first = out.ids.size();
            s.spans.clear();
            wordpiece_.tokenize(w, out.ids, offsets ? &s.spans : nullptr);
            if (offsets)
                for (size_t t = first; t < out.ids.size(); ++t) {
                    const uint32_t sb = s.spans[2 * (t - first)], se = s.spans[2 * (t - first) + 1];
                    out.offsets.push_back(orig[char_at + w.orig[sb]]);
                    out.offsets.push_back(orig[char_at + w.orig[se - 1]] + 1);
                }
            s.mark_word(out);
            return out.ids.size() <= limit;
        });
    };
    std::vector<AddedTokens::Match> matches = s.norm_matches;
    for (const AddedTokens::Match& m : matches) {
        if (out.ids.size() > limit) return;
        if (m.begin >= pos) {
            region(pos, m.begin, chars);
            chars += count_chars(n.data() + pos, m.begin - pos);
        } else {  // begins in the whitespace the previous match took with rstrip
            chars -= count_chars(n.data() + m.begin, pos - m.begin);
        }
        const size_t mchars = count_chars(n.data() + m.begin, m.end - m.begin);
        out.ids.push_back(m.id);
        if (offsets) {
            out.offsets.push_back(orig[chars]);
            out.offsets.push_back(orig[chars + mchars - 1] + 1);
        }
        s.mark_word(out);
        chars += mchars;
        pos = m.end;
    }
    region(pos, n.size(), chars);
}

void Tokenizer::encode(const std::string_view* segs, size_t nseg, bool offsets, Scratch& s, Encoded& out,
                       size_t limit) const {
    s.next_word = 0;
    for (size_t k = 0; k < nseg && out.ids.size() <= limit; ++k) {
        s.segment = static_cast<int32_t>(k);
        const char* text = segs[k].data();
        const size_t len = segs[k].size();
        auto piece = [&](size_t begin, size_t end, uint32_t char_base) {
            encode_piece(text + begin, end - begin, char_base, offsets, s, out, limit);
        };
        const AddedTokens& added = raw_added(s);
        if (added.empty()) {
            piece(0, len, 0);
            continue;
        }
        added.find(text, len, s.matches);
        size_t pos = 0;
        uint32_t chars = 0;
        for (const AddedTokens::Match& m : s.matches) {
            if (out.ids.size() > limit) break;
            if (m.begin >= pos) {
                piece(pos, m.begin, chars);
                chars += static_cast<uint32_t>(count_chars(text + pos, m.begin - pos));
            } else {  // begins in the whitespace the previous match took with rstrip
                chars -= static_cast<uint32_t>(count_chars(text + m.begin, pos - m.begin));
            }
            const uint32_t mchars = static_cast<uint32_t>(count_chars(text + m.begin, m.end - m.begin));
            out.ids.push_back(m.id);
            if (offsets) {
                out.offsets.push_back(chars);
                out.offsets.push_back(chars + mchars);
            }
            s.mark_word(out);
            chars += mchars;
            pos = m.end;
        }
        piece(pos, len, chars);
    }
}

void Tokenizer::parallel(size_t n, int num_threads, const std::function<void(size_t)>& fn,
                         const std::function<void(size_t)>* consume) {
    auto here = [&] {
        for (size_t i = 0; i < n; ++i) {
            fn(i);
            if (consume) (*consume)(i);
        }
    };
    if (num_threads <= 1 || n <= 1) {
        here();
        return;
    }
    std::unique_lock<std::mutex> lock(pool_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {  // another thread is using the pool: same results, on this thread
        here();
        return;
    }
    pool(num_threads).run(n, fn, consume);
}

ThreadPool& Tokenizer::pool(int num_threads) {
    const long pid = static_cast<long>(getpid());
    if (pool_ && pool_pid_ != pid) {
        // Forked child: the parent's workers do not exist here, so joining them would hang.
        (void)pool_.release();
    }
    if (!pool_ || pool_->size() != num_threads) {
        pool_.reset(new ThreadPool(num_threads));
        pool_pid_ = pid;
    }
    return *pool_;
}

void Tokenizer::wake_pool(int num_threads) {
    if (num_threads <= 1) return;
    std::unique_lock<std::mutex> lock(pool_mu_, std::try_to_lock);
    if (lock.owns_lock()) pool(num_threads).wake();  // else the pool is busy: this call will not get it
}

ThreadPool::LastRun Tokenizer::last_pool_run() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    return pool_ ? pool_->last_run() : ThreadPool::LastRun{};
}

Tokenizer::ThreadCache* Tokenizer::take_cache() {
    {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (!caches_.empty()) {
            const std::thread::id me = std::this_thread::get_id();
            size_t pick = caches_.size() - 1;
            for (size_t i = 0; i < caches_.size(); ++i)
                if (caches_[i]->last_user == me) pick = i;
            std::swap(caches_[pick], caches_.back());
            ThreadCache* c = caches_.back().release();
            caches_.pop_back();
            return c;
        }
    }
    return new ThreadCache();
}

void Tokenizer::give_cache(ThreadCache* c) {
    c->last_user = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(cache_mu_);
    caches_.emplace_back(c);
}

void Tokenizer::normalize_into(const char* text, size_t len, uint32_t char_base, PendingMarks& marks,
                               PreTokenizer::Buffer& n, std::vector<uint32_t>* orig) const {
    n.clear();
    if (orig) orig->clear();
    auto put = [&](uint32_t c, uint32_t at) {
        append_utf8(n, c);
        if (orig) orig->push_back(at);
    };
    auto take = [&](const uint32_t* out, int count, uint32_t at, bool isolate) {
        if (isolate) put(' ', at);
        for (int i = 0; i < count; ++i) put(out[i], at);
        if (isolate) put(' ', at);
    };
    marks.clear();
    const unsigned char* p = reinterpret_cast<const unsigned char*>(text);
    const unsigned char* end = p + len;
    for (uint32_t ci = char_base; p < end; ++ci) normalizer_.feed(decode_utf8(p), ci, marks, take);
    normalizer_.drain(marks, take);
}

std::string Tokenizer::normalize(std::string_view text) const {
    PreTokenizer::Buffer n;
    PendingMarks marks;
    normalize_into(text.data(), text.size(), 0, marks, n, nullptr);
    return std::string(n.data(), n.size());
}

void Tokenizer::clear_cache() {
    // emptied in place: their memory stays mapped, so the next batch does not pay to map it again
    short_chunks_.clear();
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (auto& c : caches_) {
        std::fill(c->words.slots.begin(), c->words.slots.end(), WordCache::Entry{});
        c->chunks.clear();
        c->texts.clear();
    }
}


std::vector<size_t> Tokenizer::chunk_bounds(const BatchInput& in, int num_threads) {
    const size_t n = in.size();
    if (num_threads <= 1 || n <= 1) return {0, n};
    // Guided chunks: each takes a 1/(2 * threads) share of the text still left, by bytes, so the
    // first ones are large (few hand-offs) and the last ones small (threads finish together).
    auto bytes = [&](size_t i) {
        size_t b = 0;
        for (uint32_t k = in.a[i]; k < in.a[i + 1]; ++k) b += in.segs[k].size();
        if (in.has_pair(i))
            for (uint32_t k = in.b[i]; k < in.b[i + 1]; ++k) b += in.segs[k].size();
        return b + 16;  // an item costs something even when empty
    };
    size_t left = 0;
    for (size_t i = 0; i < n; ++i) left += bytes(i);
    const size_t share = 2 * static_cast<size_t>(num_threads);
    std::vector<size_t> bounds{0};
    size_t i = 0;
    while (i < n) {
        const size_t target = std::max(left / share, kMinChunkBytes);
        size_t taken = 0;
        while (i < n && taken < target) taken += bytes(i++);
        left -= taken;
        bounds.push_back(i);
    }
    return bounds;
}

void Tokenizer::encode_batch(const BatchInput& in, const EncodeOptions& opts, std::vector<Rows>& out,
                             const ChunkHooks& hooks) {
    opts.validate();
    const PostConfig cfg = opts.post(template_);
    const int num_threads = opts.num_threads;
    const bool pair = !in.b.empty();
    const std::vector<size_t> bounds = chunk_bounds(in, num_threads);
    const size_t chunks = bounds.size() - 1;
    out.resize(chunks);
    for (Rows& r : out) r.clear();
    parallel(chunks, num_threads, [&](size_t c) {
        const size_t begin = bounds[c], end = bounds[c + 1];
        if (hooks.prepare && !hooks.prepare(begin, end)) return;
        ThreadCache* tc = take_cache();
        // kept with the caches: its buffers are reused, not allocated again, by the next batch
        Scratch& s = tc->scratch;
        s.words = cfg.words;
        s.split_words = in.split_words;
        s.split_special = opts.split_special_tokens;
        s.cache = &tc->words;
        s.chunks = &tc->chunks;
        s.texts = &tc->texts;
        struct Give {
            Tokenizer* t;
            ThreadCache* c;
            ~Give() {
                c->scratch.trim();
                t->give_cache(c);
            }
        } give{this, tc};
        Rows& rows = out[c];
        // A single sequence cut on the right without overflow rows needs only its first tokens.
        size_t limit = SIZE_MAX;
        if (!pair && cfg.truncation != Truncation::kNone && !cfg.overflow && !cfg.truncate_left) {
            const size_t added = cfg.add_special_tokens ? template_.specials(false) : 0;
            if (cfg.max_length >= added) limit = cfg.max_length - added;
        }
        for (size_t i = begin; i < end; ++i) {
            s.a.clear();
            encode(in.segs.data() + in.a[i], in.a[i + 1] - in.a[i], cfg.offsets, s, s.a, limit);
            const bool has_pair = in.has_pair(i);
            if (has_pair) {
                s.b.clear();
                encode(in.segs.data() + in.b[i], in.b[i + 1] - in.b[i], cfg.offsets, s, s.b);
            }
            post_process(s.a, has_pair ? &s.b : nullptr, cfg, static_cast<int32_t>(i), rows);
        }
        if (hooks.encoded) hooks.encoded(rows);
    }, hooks.consume ? &hooks.consume : nullptr);
}

}  // namespace fastbert
