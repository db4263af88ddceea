"""Model sources: hub ids, GGUF files, llama2.c checkpoints and the embedded model, loaded as one handle."""
