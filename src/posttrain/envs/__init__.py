"""Environments and tools for multi-turn episodes (agentic RL): what a tool is (`tools`: typed, documented
callables and their JSON schemas), how the model calls one (`calls`: the tool-call format), where an episode's
environment lives (`host`: one instance per episode, built from its row) and the process that runs it
(`process`: per-call limits, failures the model reads, replacement with replay), the token-exact episode loop
(`episodes`), what the RL stage checks before any actor starts (`plan`), plus the built-in environments
(`builtin`: Calculator, GuessNumber) and the adapter that runs OpenEnv environments unchanged (`openenv`)."""
