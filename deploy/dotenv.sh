# Sourced by deploy/images.sh and deploy/stack-test.sh: the variables of ./.env (the file
# docker compose reads) that the environment does not set already, exported, as compose
# resolves them (the environment wins). KEY=VALUE lines only; quotes around VALUE are removed.
if [ -f .env ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in '' | '#'*) continue ;; esac
        key="${line%%=*}"
        value="${line#*=}"
        value="${value%\"}"; value="${value#\"}"; value="${value%\'}"; value="${value#\'}"
        [[ "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
        [ -n "${!key+set}" ] || export "$key=$value"
    done < .env
fi
