"""The proxy's wire models and error body: upstream's names and fields
(managed_server_proxy.py imports them, so upstream's import path holds)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict


class ChatMessage(BaseModel):
    """One message. `content` may also come as OpenAI's list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            message["content"] = "".join(
                str(part.get("text", "")) for part in self.content if part.get("type") == "text"
            )
        return message


class ChatCompletionProxyRequest(BaseModel):
    """Upstream's request, plus the fields the `openai` SDK sends that it ignored."""

    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: list[str] | str | None = None
    tools: list[dict] | None = None
    tool_choice: Any | None = None  # "auto", "none", "required", or a dict
    stream: bool = False

    def token_limit(self) -> int:
        """The requested completion length (upstream's default: 1024)."""
        return self.max_tokens or self.max_completion_tokens or 1024


class SessionCreateRequest(BaseModel):
    tool_parser: str = "hermes"
    track_tree: bool = False
    base_url: str | None = None
    """Pin the session to the backend with this base_url (default: the most free one)."""


class SessionCreateResponse(BaseModel):
    uuid: str
    model_name: str
    tool_parser: str
    base_url: str | None = None
    created_at: float


class RenderResponse(BaseModel):
    prompt_text: str
    token_ids: list[int]
    num_tokens: int


def openai_error(
    status_code: int, message: str, error_type: str = "invalid_request_error"
) -> JSONResponse:
    """Upstream's error body: what the `openai` SDK reads its exception from."""
    body = {"error": {"message": message, "type": error_type, "code": status_code}}
    return JSONResponse(status_code=status_code, content=body)
