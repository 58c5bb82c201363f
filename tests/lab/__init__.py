"""Lab tests: real lab hosts (systemd-nspawn + sshd), some the real vLLM CPU build."""
