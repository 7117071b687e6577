#include "vocab.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "pre_tokenizer.h"
#include "unicode_tables.h"

namespace fastbert {

Vocab Vocab::from_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open vocabulary file " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string data = ss.str();
    std::vector<std::string> tokens;
    auto valid_utf8 = [&](size_t b, size_t e) {
        for (size_t i = b; i < e;) {
            const unsigned char c = static_cast<unsigned char>(data[i]);
            size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
            if (!n || i + n > e) return false;
            for (size_t k = 1; k < n; ++k)
                if ((static_cast<unsigned char>(data[i + k]) & 0xC0) != 0x80) return false;
            i += n;
        }
        return true;
    };
    auto add_line = [&](size_t b, size_t e) {
        if (!valid_utf8(b, e))
            throw std::invalid_argument(path + ": line " + std::to_string(tokens.size() + 1) + " is not valid UTF-8");
        // trim trailing White_Space, as Rust's str::trim_end
        while (e > b) {
            size_t j = e - 1;
            while (j > b && (static_cast<unsigned char>(data[j]) & 0xC0) == 0x80) --j;
            const unsigned char* p = reinterpret_cast<const unsigned char*>(data.data() + j);
            if (!(unicode::flags(decode_utf8(p)) & unicode::kWhitespace)) break;
            e = j;
        }
        tokens.emplace_back(data, b, e - b);
    };
    size_t start = 0;
    for (size_t i = 0; i < data.size(); ++i) {
        if (data[i] == '\n') {
            add_line(start, i);
            start = i + 1;
        }
    }
    if (start < data.size()) add_line(start, data.size());
    return Vocab(std::move(tokens));
}

Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
    map_.reserve(tokens_.size());
    // a repeated token maps to its last line, as a Python dict built line by line does
    for (size_t i = 0; i < tokens_.size(); ++i) map_.insert(tokens_[i], static_cast<int32_t>(i), true);
    id_of_line_.resize(tokens_.size());
    for (size_t i = 0; i < tokens_.size(); ++i) id_of_line_[i] = id(tokens_[i]) == static_cast<int32_t>(i);
    distinct_ = map_.size();
}

int32_t Vocab::add(const std::string& token) {
    int32_t existing = id(token);
    if (existing >= 0) return existing;
    tokens_.push_back(token);
    id_of_line_.push_back(true);
    ++distinct_;
    int32_t id = static_cast<int32_t>(tokens_.size() - 1);
    map_.insert(token, id, true);
    return id;
}

}  // namespace fastbert
