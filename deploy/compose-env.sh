#!/usr/bin/env sh
# Write the .env file docker-compose reads beside docker-compose.yml: a fresh cluster secret and
# bootstrap admin token, readable by you only. Every later docker-compose command (up, ps, logs,
# down -v) finds them there, in any shell; nothing to export.
#   deploy/compose-env.sh [FILE]      (default: .env beside docker-compose.yml; never overwrites)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
file=${1:-$here/.env}
if [ -e "$file" ]; then
  echo "compose-env.sh: $file exists; keeping it (the cluster's data was made with its secret)" >&2
  exit 1
fi
hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }
umask 077
{
  echo "# raftq cluster credentials (deploy/compose-env.sh); keep this file private"
  echo "RAFTQ_SECRET=$(hex 16)"
  echo "RAFTQ_ADMIN_TOKEN=rq_admin.$(hex 32)"
} > "$file"
echo "wrote $file; clients and the CLI send the admin token:"
echo "  export RAFTQ_TOKEN=\$(sed -n 's/^RAFTQ_ADMIN_TOKEN=//p' $file)"
