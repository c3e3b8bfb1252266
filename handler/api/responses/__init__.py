"""OpenAI's Responses API (`v1/responses`): schemas, the conversation, output events, the stored responses."""
