"""Every door under hostile use: authentication, tenants, hosts, secrets, input."""
