"""The chat model that connects LangChain graphs to verlog's engines, token-exact."""

from verlog.llm.chat_model import EPISODE_ID_KEY, VerlogChatModel
from verlog.llm.prompt import PromptRenderer
from verlog.llm.tool_calls import ParsedToolCalls, parse_tool_calls, tool_schemas

__all__ = ["EPISODE_ID_KEY", "ParsedToolCalls", "PromptRenderer", "VerlogChatModel", "parse_tool_calls", "tool_schemas"]
