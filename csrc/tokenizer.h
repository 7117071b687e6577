// The whole BERT tokenizer: added tokens -> normalizer + pre-tokenizer -> WordPiece ->
// post-processor, for one text or a batch (on a thread pool). Output layout: output_layout.h.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "added_tokens.h"
#include "chunk_cache.h"
#include "encode_options.h"
#include "normalizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"
#include "shared_chunk_cache.h"
#include "text_cache.h"
#include "thread_pool.h"
#include "vocab.h"
#include "wordpiece.h"

namespace fastbert {

struct TokenizerConfig {
    NormalizerConfig normalizer;
    std::string unk_token = "[UNK]";
    std::string continuing_subword_prefix = "##";
    size_t max_input_chars_per_word = 100;
};

// A batch of inputs: item i's first sequence is segs[a[i] .. a[i+1]) (one segment for a str,
// one per word for pre-split input), its pair (when b is not empty) segs[b[i] .. b[i+1]).
struct BatchInput {
    std::vector<std::string_view> segs;
    std::vector<uint32_t> a{0};
    std::vector<uint32_t> b;
    std::vector<uint8_t> single;  // with b: 1 for an item without a pair (a batch mixing texts and pairs)
    bool split_words = false;     // segments are the user's words (is_split_into_words)
    size_t size() const { return a.size() - 1; }
    bool has_pair(size_t i) const { return !b.empty() && (single.empty() || !single[i]); }
};

class Tokenizer {
 public:
    // added: tokens never split (specials included); those missing from vocab get new ids.
    Tokenizer(Vocab vocab, const TokenizerConfig& cfg, std::vector<AddedToken> added);

    struct Scratch {
        PreTokenizer::Scratch pre;
        std::vector<AddedTokens::Match> matches, norm_matches;
        PreTokenizer::Buffer norm;          // normalized text (normalized added tokens only)
        std::vector<uint32_t> norm_orig;    // its characters' original indices
        PendingMarks marks;                 // its combining marks waiting for a starter
        std::vector<uint32_t> spans;
        Encoded a, b;
        WordCache* cache = nullptr;
        ChunkCache* chunks = nullptr;
        TextCache* texts = nullptr;
        // word tracking (offset paths only): each word's tokens get split_words ? its segment
        // index : a running count of pre-tokens and added tokens in the sequence
        bool words = false, split_words = false;
        bool split_special = false;  // the special added tokens are not matched (split_special_tokens)
        int32_t next_word = 0, segment = 0;
        // Drops buffers grown past kKeepBytes by a long text, so an idle tokenizer does not hold them.
        void trim() {
            static constexpr size_t kKeepBytes = size_t{1} << 20;
            if (a.ids.capacity() * sizeof(int32_t) > kKeepBytes || b.ids.capacity() * sizeof(int32_t) > kKeepBytes ||
                norm.capacity() > kKeepBytes || pre.word.capacity() > kKeepBytes ||
                spans.capacity() * sizeof(uint32_t) > kKeepBytes)
                *this = Scratch();
        }
        void mark_word(Encoded& out) {
            if (!words) return;
            out.words.resize(out.ids.size(), split_words ? segment : next_word);
            ++next_word;
        }
    };
    // Appends the tokens of the segments (no special tokens) to out; may stop once out has more
    // than limit tokens (the rest would be truncated away). Word indices (s.words) restart at 0.
    void encode(const std::string_view* segs, size_t nseg, bool offsets, Scratch& s, Encoded& out,
                size_t limit = SIZE_MAX) const;

    // What the caller of encode_batch does around each chunk; both optional.
    struct ChunkHooks {
        // On the thread that encodes items [begin, end), before it reads their segments (it may
        // fill them in); false leaves the chunk without rows (the caller then fails the batch).
        std::function<bool(size_t begin, size_t end)> prepare;
        // On the calling thread, for each chunk c in order as soon as out[0..c] are final, while the
        // pool still encodes the later chunks (ThreadPool::run).
        std::function<void(size_t c)> consume;
        // On the thread that encoded a chunk, right after it, with its rows (still in that core's
        // cache): padded arrays whose shape was known before encoding are filled here.
        std::function<void(const Rows& rows)> encoded;
    };
    // Encodes and post-processes a batch; one Rows per chunk, in input order. The layout options
    // (padding, packed, numpy) play no part here: output_layout.h reads them.
    // opts.num_threads <= 1 runs on the calling thread.
    void encode_batch(const BatchInput& in, const EncodeOptions& opts, std::vector<Rows>& out,
                      const ChunkHooks& hooks = {});
    // The post-processor's template (BERT's with ids 0 until set); validated here. Not while a
    // batch runs: the Python object sets it once, when it is made.
    void set_template(Template t) {
        t.validate();
        template_ = std::move(t);
    }
    // BERT's template with these [CLS] and [SEP] ids.
    void set_specials(int32_t cls_id, int32_t sep_id) { set_template(Template::bert(cls_id, sep_id)); }
    const Template& post_template() const { return template_; }
    // Runs fn(0..n-1) on the pool (num_threads <= 1, or the pool busy: on the calling thread), and
    // consume(i) in order on the calling thread when given (see ThreadPool::run).
    void parallel(size_t n, int num_threads, const std::function<void(size_t)>& fn,
                  const std::function<void(size_t)>* consume = nullptr);

    // A batch of at least kWakeBytes is about to be encoded on num_threads threads: starts the
    // pool's sleeping workers now, so that they run by the time it comes (see ThreadPool::wake).
    static constexpr size_t kWakeBytes = 2 * 4096;
    void wake_pool(int num_threads);
    // What the pool's workers did in its last batch (ThreadPool::LastRun; all zero before the first).
    ThreadPool::LastRun last_pool_run();

    // Forgets every cached word (the caches of running batches are left alone).
    void clear_cache();
    const Vocab& vocab() const { return vocab_; }
    int32_t token_id(std::string_view t) const { return vocab_.id(t); }
    // The BERT normalizer's output for a UTF-8 text (HF's normalize_str): what normalized added
    // tokens are matched in, and what their token strings are cut from.
    std::string normalize(std::string_view text) const;

 private:
    Vocab vocab_;
    Template template_ = Template::bert(0, 0);
    // Appends the tokens of text[0..len) (no added tokens in it), characters from char_base.
    bool encode_piece(const char* text, size_t len, uint32_t char_base, bool offsets, Scratch& s, Encoded& out,
                      size_t limit) const;
    // The same when normalized added tokens exist: normalize first, match them, then split.
    // The normalizer over text (whose first character is character char_base of the original):
    // its output into n and, when orig is given, each output character's original index.
    void normalize_into(const char* text, size_t len, uint32_t char_base, PendingMarks& marks,
                        PreTokenizer::Buffer& n, std::vector<uint32_t>* orig) const;
    void encode_normalized(const char* text, size_t len, uint32_t char_base, bool offsets, Scratch& s,
                           Encoded& out, size_t limit) const;

    AddedTokens added_;             // matched in the raw text
    AddedTokens added_normalized_;  // matched in the normalized text
    // the same without the special tokens: what split_special_tokens matches
    AddedTokens added_plain_, added_normalized_plain_;
    const AddedTokens& raw_added(const Scratch& s) const { return s.split_special ? added_plain_ : added_; }
    const AddedTokens& normalized_added(const Scratch& s) const {
        return s.split_special ? added_normalized_plain_ : added_normalized_;
    }
    Normalizer normalizer_;
    PreTokenizer identity_pre_;     // splits already-normalized text
    PreTokenizer pre_;
    WordPiece wordpiece_;
    // The pool is made on first parallel use, and made again in a forked child (its threads
    // do not exist there); busy_ lets concurrent callers fall back to their own thread.
    struct ThreadCache {
        Scratch scratch;
        WordCache words;
        ChunkCache chunks;
        TextCache texts;
        std::thread::id last_user;  // the thread that gave it back last
    };
    // The idle cache this thread used last, if any (it is still in this core's CPU caches; the
    // tasks of a batch go to whichever thread is free, so without this the caches moved from core
    // to core within one batch), else any.
    ThreadCache* take_cache();
    void give_cache(ThreadCache* c);
    // encode_piece without offsets: through the text cache, then chunk by chunk through the chunk cache.
    void encode_cached(const char* text, size_t len, Scratch& s, Encoded& out, size_t limit) const;
    // How far encode_chunks got: text bytes (up to a chunk end) and out.ids' size for them.
    struct Progress {
        size_t bytes, ids;
    };
    Progress encode_chunks(const char* text, size_t len, Scratch& s, Encoded& out, size_t limit) const;
    // encode_batch's tasks: item ranges [bounds[c], bounds[c + 1]), one Rows each.
    static constexpr size_t kMinChunkBytes = kWakeBytes / 2;  // some tens of microseconds of new text
    static std::vector<size_t> chunk_bounds(const BatchInput& in, int num_threads);

    ThreadPool& pool(int num_threads);  // under pool_mu_: made on first use, and again after a fork
    std::unique_ptr<ThreadPool> pool_;
    std::mutex cache_mu_;
    std::vector<std::unique_ptr<ThreadCache>> caches_;  // idle word caches, one taken per running chunk
    mutable SharedChunkCache short_chunks_;  // the short chunks of every thread (a cache: filled by const encodes)
    long pool_pid_ = 0;
    std::mutex pool_mu_;
};

}  // namespace fastbert
