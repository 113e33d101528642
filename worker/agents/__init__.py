"""The in-process agent API: ``AgentLifecycleManager`` and lifecycle hooks.

Owns nothing on its own: it calls working memory and publishes hook events.
"""
