from vmdisktouch.cli import main

raise SystemExit(main())
