"""Plain typed Python functions that graphs offer their models as tools.

The same function objects are used in training and in production: a tool is declared once,
here, and passed to ``model.bind_tools([...])`` and LangGraph's ``ToolNode``.
"""
