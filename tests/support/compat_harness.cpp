// specreg's differential-test harness: asks the pinned llama.cpp itself whether pairs of GGUF
// vocabularies are compatible for speculative decoding.
//
// stdin:  N, then N GGUF paths (one a line), then pairs "TARGET_INDEX DRAFT_INDEX" until EOF.
// stdout: "M i type add_bos add_eos bos eos n_tokens" per loaded model ("M i ERR" if llama.cpp
//         cannot load it), then "P t d R" per pair, R = common_speculative_are_compatible (0/1)
//         or "ERR" when either model failed to load.
// Models are loaded once each with vocab_only, so no weights are read.

#include "llama.h"
#include "speculative.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

static void quiet_log(ggml_log_level, const char *, void *) {}

int main() {
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    size_t n = 0;
    std::string line;
    if (!std::getline(std::cin, line)) {
        return 2;
    }
    n = std::stoul(line);
    std::vector<llama_model *> models(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
        if (!std::getline(std::cin, line)) {
            return 2;
        }
        llama_model_params mp = llama_model_default_params();
        mp.vocab_only = true;
        models[i] = llama_model_load_from_file(line.c_str(), mp);
        if (!models[i]) {
            std::printf("M %zu ERR\n", i);
            continue;
        }
        const llama_vocab * v = llama_model_get_vocab(models[i]);
        std::printf("M %zu %d %d %d %d %d %d\n", i, (int) llama_vocab_type(v),
                    (int) llama_vocab_get_add_bos(v), (int) llama_vocab_get_add_eos(v),
                    (int) llama_vocab_bos(v), (int) llama_vocab_eos(v), llama_vocab_n_tokens(v));
    }
    size_t t = 0, d = 0;
    while (std::cin >> t >> d) {
        if (t >= n || d >= n) {
            return 2;
        }
        if (!models[t] || !models[d]) {
            std::printf("P %zu %zu ERR\n", t, d);
            continue;
        }
        const bool ok = common_speculative_are_compatible(models[t], models[d]);
        std::printf("P %zu %zu %d\n", t, d, ok ? 1 : 0);
    }
    for (auto * m : models) {
        if (m) {
            llama_model_free(m);
        }
    }
    llama_backend_free();
    return 0;
}
