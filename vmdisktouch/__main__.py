from vmdisktouch.commands.cli import main

raise SystemExit(main())
