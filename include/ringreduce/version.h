/* ringreduce's version: the one place it is written. CMake reads it from here (project()), the
 * library reports it at run time (rr_version(), Communicator::version(), ringreduce.__version__,
 * every tool's --version), so a header and a library of different releases can be told apart:
 * compare RINGREDUCE_VERSION_STRING with rr_version(). Plain C, for the C ABI's users too. */
#ifndef RINGREDUCE_VERSION_H_
#define RINGREDUCE_VERSION_H_

#define RINGREDUCE_VERSION_MAJOR 0
#define RINGREDUCE_VERSION_MINOR 2
#define RINGREDUCE_VERSION_PATCH 0
#define RINGREDUCE_VERSION_STRING "0.2.0"
/* One number that grows with every release: 10000 * major + 100 * minor + patch. */
#define RINGREDUCE_VERSION_CODE \
  (RINGREDUCE_VERSION_MAJOR * 10000 + RINGREDUCE_VERSION_MINOR * 100 + RINGREDUCE_VERSION_PATCH)

#endif /* RINGREDUCE_VERSION_H_ */
