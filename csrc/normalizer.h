// BERT normalizer, one code point at a time (HF normalizers/bert.rs): clean_text, then
// handle_chinese_chars, then strip_accents (NFD, drop Mn), then lowercase. Every step maps one
// input code point to zero or more output code points, so it runs fused with the pre-tokenizer.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace fastbert {

struct NormalizerConfig {
    bool clean_text = true;
    bool handle_chinese_chars = true;
    bool strip_accents = true;  // resolved: None -> lowercase
    bool lowercase = true;
};

class Normalizer {
 public:
    static constexpr int kMaxOut = 32;
    struct Result {
        int n = 0;             // output code points in out[0..n)
        bool isolate = false;  // a CJK ideograph: its own word (handle_chinese_chars)
    };
    explicit Normalizer(const NormalizerConfig& cfg);
    Normalizer() : Normalizer(NormalizerConfig{}) {}

    // Normalizes one code point (any value, ASCII included).
    Result normalize(uint32_t cp, uint32_t* out) const;
    const NormalizerConfig& config() const { return cfg_; }

 private:
    NormalizerConfig cfg_;
};

}  // namespace fastbert
