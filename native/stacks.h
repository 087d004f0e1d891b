// Every thread's stack of this process, written to a file: what was each thread doing while an
// I/O thread sat inside a provider call that does not return (TSNET_STALL_STACKS,
// docs/configuration.md). A diagnostic, off unless that variable is set: then tsnet's threads
// leave one real-time signal unblocked (stackSignal), and the first dump installs a handler for
// it that stays for the life of the process (a signal still pending in a thread that blocks it
// must never meet the default action, which ends the process).
#pragma once
#include <string>

namespace tsn {

// Whether TSNET_STALL_STACKS is set (read once).
bool stackDumpsOn();

// The signal the dump sends each thread: SIGRTMAX - 5.
int stackSignal();

struct StackDump {
  int threads = 0;   // threads of the process signalled
  int answered = 0;  // threads whose handler wrote their stack (others block the signal)
  std::string file;  // where the stacks went
  std::string error; // why nothing was written, when nothing was
};

// Writes each thread's id, name and stack (backtrace_symbols_fd: library + offset, names where
// the library exports them) to pathTemplate ("%p" becomes the pid), appending. One thread at a
// time, at most 200 ms each. Serialised: concurrent calls wait for each other.
StackDump dumpStacks(const std::string& pathTemplate);

}  // namespace tsn
