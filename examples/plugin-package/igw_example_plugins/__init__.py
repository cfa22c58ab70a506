"""Example EPP plugins: a pre-request plugin that counts picks per endpoint and a scorer
that reads those counts through the plugin handle."""
