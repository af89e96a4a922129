"""The checks ``AdminClient`` runs on its settings, one function each, for tools that validate
a configuration before they make a client: the command line's config file reports every
store's wrong keys at once, each under its own key. Each returns the value it accepts or
raises ``ConfigError`` with the message the client would show (never echoing a token or a
URL's credentials).

- :data:`DEFAULT_VERSION`: the interface version the client implements;
- :func:`check_token`, :func:`check_version`: one setting each;
- :func:`versioned_base`: the base URL checked and made ``{base_url}/admin/{version}/``;
  a plain ``http://`` URL passes only for a loopback host (:func:`is_loopback`) or with
  ``allow_insecure=True``.
"""

from ._protocol import DEFAULT_VERSION, check_token, check_version, is_loopback, versioned_base

__all__ = ["DEFAULT_VERSION", "check_token", "check_version", "is_loopback", "versioned_base"]
