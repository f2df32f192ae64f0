# HF tokenizer.json support (src/data/hf_tokenizer.c): PCRE2 (Unicode property regexes of byte-level BPE
# pre-tokenizers) and utf8proc (the NFC normalizer of Qwen2-style tokenizers). Included by the top-level
# CMakeLists.txt; both are Debian packages (scripts/deps.sh).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
target_link_libraries(suanli PUBLIC PkgConfig::PCRE2 PkgConfig::UTF8PROC)
