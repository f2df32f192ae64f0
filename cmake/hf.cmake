# HF tokenizer.json support (src/data/hf_tokenizer.c): PCRE2 (Unicode property regexes of byte-level BPE
# pre-tokenizers) and utf8proc (the NFC normalizer of Qwen2-style tokenizers). Included by the top-level
# CMakeLists.txt; both are Debian packages (scripts/deps.sh).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
sl_library_link(PkgConfig::PCRE2 PkgConfig::UTF8PROC)
string(APPEND SL_PC_REQUIRES " libpcre2-8 libutf8proc")
list(APPEND SL_PACKAGE_PKGCONFIG "PCRE2 libpcre2-8" "UTF8PROC libutf8proc")
