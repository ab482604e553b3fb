"""`specreg serve`: an OpenAI-compatible front that routes each request, by task, to a
llama-server running the configuration chosen for that target and task."""
