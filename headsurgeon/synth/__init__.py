"""Programs (DSL and sandboxed Python), metrics and the searchers that find them."""
