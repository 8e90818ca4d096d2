"""r1desk's local OpenAI-compatible HTTP API (chat completions), served on the app's asyncio loop."""
